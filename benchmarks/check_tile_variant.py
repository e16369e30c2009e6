"""A tuning entry of the Hopper forward's tile table (SAMATTN_HOPPER_TILE=N, a
-DSAMATTN_HOPPER_TUNING=ON build) against the library's default on shapes that stress the tile
loop: more work units than SMs (blocks chain tiles), tiles with a warpgroup that has no row
(S = 1050) or whose rows pass on blocks (causal, windows), kv_stride 3 and 4, grouped heads,
block-sparse maps. The entries differ only in when copies and GEMMs are issued, so the outputs
and lse must be the same bytes, and finite (the inputs are random normal). Exits 1 on any
difference. Run it under `timeout`: a protocol deadlock shows as a hang.

    python3 benchmarks/check_tile_variant.py --tile 1 --head-dim 128
"""

from __future__ import annotations

import argparse
import sys

import torch

import samattn
from samattn.bench.timing import environment_variable
from samattn.block_sparse import from_map


def cases(head_dim: int):
    """(name, call) pairs; each call takes a generator and returns (output, lse)."""
    def dense(b, h, hkv, sq, sk, **kw):
        def call(gen):
            q = torch.randn(b, h, sq, head_dim, device="cuda", generator=gen).bfloat16()
            k = torch.randn(b, hkv, sk, head_dim, device="cuda", generator=gen).bfloat16()
            v = torch.randn(b, hkv, sk, head_dim, device="cuda", generator=gen).bfloat16()
            return q, k, v, kw
        return call

    yield "S1050", dense(4, 16, 16, 1050, 1050)
    yield "S1050 causal", dense(4, 16, 16, 1050, 1050, causal=True)
    yield "Sq1000 Sk2048 gqa 4:1", dense(2, 16, 4, 1000, 2048)
    yield "Sq1000 Sk2048 gqa 4:1 causal", dense(2, 16, 4, 1000, 2048, causal=True)
    yield "Sq300 Sk400 causal", dense(2, 6, 3, 300, 400, causal=True)
    yield "Sq77 Sk129", dense(3, 8, 8, 77, 129)
    yield "Sq1 Sk1000", dense(2, 8, 8, 1, 1000)
    yield "S4096 kv_stride 4", dense(4, 16, 16, 4096, 4096, kv_stride=4)
    yield "S4096 kv_stride 3 causal", dense(2, 16, 16, 4096, 4096, kv_stride=3, causal=True)
    yield "S8192 window 256 causal", dense(1, 16, 16, 8192, 8192, causal=True, window=(256, 0))
    yield "S8192 window 1k", dense(1, 16, 16, 8192, 8192, window=(1024, 1024))


def block_sparse_case(head_dim: int, gen):
    s = 8192
    blocks = s // 128
    keep = torch.rand(1, 16, blocks, blocks, device="cuda", generator=gen) < 0.1
    keep |= torch.eye(blocks, dtype=torch.bool, device="cuda")
    sparse = from_map(keep, 128, 128)
    q, k, v = (torch.randn(1, 16, s, head_dim, device="cuda", generator=gen).bfloat16()
               for _ in range(3))
    return q, k, v, {"block_sparse": sparse}


def run(tile: str, q, k, v, kw):
    with environment_variable("SAMATTN_HOPPER_TILE", tile):
        out, lse = samattn.attention(q, k, v, backend="hopper", return_lse=True, **kw)
    torch.cuda.synchronize()
    return out, lse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tile", required=True)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    problems = [(name, make(gen)) for name, make in cases(args.head_dim)]
    problems.append(("S8192 block-sparse 10%", block_sparse_case(args.head_dim, gen)))
    failures = 0
    for name, (q, k, v, kw) in problems:
        base_out, base_lse = run("", q, k, v, kw)
        out, lse = run(args.tile, q, k, v, kw)
        finite = bool(torch.isfinite(out).all()) and not bool(torch.isnan(lse).any())
        same = torch.equal(out, base_out) and torch.equal(lse, base_lse)
        failures += not (same and finite)
        print(f"{name:34s} tile {args.tile} vs default: {'same bytes' if same else 'DIFFERENT'}"
              f"{'' if finite else ' (NaN or inf in the output)'}", flush=True)
    print(f"check_tile_variant: {len(problems) - failures}/{len(problems)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
