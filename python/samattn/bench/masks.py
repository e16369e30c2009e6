"""The `masks` suite: issue #6's targets measured side by side in one process (bf16, B = 1,
H = 16, D = 128, S = 16k):

  - cost proportional to density: a pattern keeping a fraction f of the 128 x 128 key blocks
    runs in <= 1.2 f x the dense time (plus launch overhead); reported against samattn's dense
    call on the same (tensor-core, mma.sync) kernel family and against the fastest dense call
    (Hopper wgmma on sm_90);
  - Sparse Transformer strided (l = 128, causal) >= 3x FlexAttention given the same mask_mod;
  - sliding window 1024 (causal) >= 1.0x FlexAttention; the fixed pattern beside them;
  - varlen with mixed lengths >= 0.95x the dense time of the padded batch scaled by the
    fraction of useful tokens.

Each case defines its mask once, as a vectorised function visible(b, q_idx, kv_idx) -> bool; that
definition builds FlexAttention's block mask (compiled flex_attention, the block mask built
outside the timed region), the fp64 reference and the FLOP count (4 D per visible pair). Every
output is checked before it is timed: against an fp64 reference of the first and last 2048 query
rows of the first and last head (16k x 16k in fp64 for every head would take minutes), the
varlen outputs against per-sequence fp64 references of every row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import samattn
from samattn.bench.flex import compiled_flex_attention
from samattn.bench.timing import measure, peak_memory_bytes

_MAX_REL_ERROR = 2e-2  # bf16: the output's rounding (2^-8) with margin
_BLOCK = 128  # FlexAttention's block size, the unit of the density f
_CHECK_ROWS = 2048


@dataclass
class MaskCase:
    name: str
    visible: Optional[Callable]  # (b, q_idx, kv_idx) broadcastable int tensors -> bool tensor
    samattn_options: dict
    flex: bool = False  # also time FlexAttention with this mask_mod
    density: bool = True  # a row of the density sweep
    extra: Dict = field(default_factory=dict)


def _causal(b, q, k):
    return q >= k


def _window(left):
    return lambda b, q, k: (q >= k) & (q - k <= left)


def _strided(l):
    return lambda b, q, k: (q >= k) & (((q - k) < l) | ((q - k) % l == 0))


def _fixed(l, c):
    return lambda b, q, k: (q >= k) & (((q // l) == (k // l)) | ((k % l) >= l - c))


def _block_map_case(fraction: float, seqlen: int, seed: int) -> MaskCase:
    """Block-sparse with a random fraction of 128 x 128 blocks listed (the diagonal always, so
    that no row is empty)."""
    blocks = seqlen // _BLOCK
    gen = torch.Generator().manual_seed(seed)
    listed = torch.rand(blocks, blocks, generator=gen) < fraction
    listed |= torch.eye(blocks, dtype=torch.bool)
    bs = samattn.block_sparse.from_map(listed[None, None], _BLOCK, _BLOCK)

    def visible(b, q, k):
        m = listed.to(q.device)
        return m[q // _BLOCK, k // _BLOCK]

    return MaskCase(f"block-sparse {fraction:.0%} of 128x128 blocks", visible,
                    dict(block_sparse=bs), extra={"listed": listed})


def cases(quick: bool, seqlen: int) -> List[MaskCase]:
    out = [
        MaskCase("causal (option)", _causal, dict(causal=True)),
        MaskCase("sliding window 256 (causal)", _window(256), dict(window=(256, 0), causal=True)),
        MaskCase("sliding window 1024 (causal)", _window(1024), dict(window=(1024, 0), causal=True),
                 flex=True),
        MaskCase("sliding window 4096 (causal)", _window(4096), dict(window=(4096, 0), causal=True)),
        MaskCase("strided l=128 (Sparse Transformer, causal)", _strided(128),
                 dict(sparse_pattern="strided", sparse_block=128), flex=True),
        # --quick compiles FlexAttention for the two target rows only (about 20-40 s each).
        MaskCase("fixed l=128 c=16 (Sparse Transformer, causal)", _fixed(128, 16),
                 dict(sparse_pattern="fixed", sparse_block=128, sparse_summary=16),
                 flex=not quick),
    ]
    fractions = (0.1, 0.5) if quick else (0.05, 0.1, 0.25, 0.5)
    out += [_block_map_case(f, seqlen, seed=i) for i, f in enumerate(fractions)]
    return out


# ---- mask evaluation ---------------------------------------------------------------------------

def _rows(case: MaskCase, begin: int, end: int, seqlen: int, device) -> torch.Tensor:
    q = torch.arange(begin, end, device=device)[:, None]
    k = torch.arange(seqlen, device=device)[None, :]
    return case.visible(torch.zeros_like(q), q, k).expand(end - begin, seqlen)


def mask_statistics(case: MaskCase, seqlen: int, device) -> Dict[str, float]:
    """Visible pairs and the fraction f of 128 x 128 blocks holding one."""
    pairs, blocks = 0, 0
    for begin in range(0, seqlen, _BLOCK * 16):
        rows = _rows(case, begin, min(begin + _BLOCK * 16, seqlen), seqlen, device)
        pairs += int(rows.sum())
        blocks += int(rows.reshape(-1, _BLOCK, seqlen // _BLOCK, _BLOCK).any(3).any(1).sum())
    return {"pairs": float(pairs), "density": blocks / (seqlen // _BLOCK) ** 2}


def _check_rows(seqlen: int) -> List[range]:
    return [range(0, min(_CHECK_ROWS, seqlen)), range(max(0, seqlen - _CHECK_ROWS), seqlen)]


def reference_rows(case: MaskCase, q, k, v, heads: List[int]) -> Dict:
    """fp64 attention of the checked rows (fully masked rows give 0)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    seqlen = q.shape[2]
    out = {}
    for h in heads:
        k64, v64 = k[0, h].double(), v[0, h].double()
        for rows in _check_rows(seqlen):
            scores = (q[0, h, rows.start:rows.stop].double() @ k64.T) * scale
            scores.masked_fill_(~_rows(case, rows.start, rows.stop, seqlen, q.device),
                                float("-inf"))
            out[(h, rows.start)] = torch.softmax(scores, -1).nan_to_num(0.0) @ v64
            del scores
    return out


def relative_error(out, ref: Dict) -> float:
    num = den = 0.0
    for (h, start), want in ref.items():
        got = out[0, h, start:start + want.shape[0]].double()
        num += float((got - want).norm() ** 2)
        den += float(want.norm() ** 2)
    return math.sqrt(num / max(den, 1e-300))


# ---- methods ---------------------------------------------------------------------------------

_FLEX: Dict = {}


def _flex_call(case: MaskCase, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask

    if case.name not in _FLEX:
        visible = case.visible

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(b, q_idx, kv_idx)

        _FLEX[case.name] = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2],
                                             device=q.device)
    return compiled_flex_attention()(q, k, v, block_mask=_FLEX[case.name])


_MAPS: Dict = {}


def _samattn_call(case: MaskCase, q, k, v):
    options = dict(case.samattn_options)
    bs = options.pop("block_sparse", None)
    if bs is None:
        return samattn.attention(q, k, v, **options)
    # The block map is built once from the tables (as Flex's block mask is), outside the timed
    # calls: BlockSparse.to_map validates the tables with a host read.
    if case.name not in _MAPS:
        _MAPS[case.name] = samattn.BlockSparse(bs.kv_num_blocks.to(q.device),
                                               bs.kv_indices.to(q.device), bs.block_q,
                                               bs.block_k).to_map(k.shape[2])
    out, _ = samattn.ops.attention_forward(q, k, v, None, False, 1, False, "auto", None, -1, -1,
                                           "none", 0, 0, _MAPS[case.name], bs.block_q,
                                           bs.block_k)
    return out


def _row(label: str, method: str, flops: float, seqlen: int, heads: int, head_dim: int,
         batch: int = 1) -> dict:
    return {"method": method, "label": label, "mask": label, "batch": batch, "heads": heads,
            "heads_kv": 0, "seqlen": seqlen, "head_dim": head_dim, "dtype": "bf16",
            "causal": True, "kv_stride": 1, "direction": "fwd", "flops": flops,
            "timing": "device events"}


def _timed(call: Callable, error: float, budget_ms: float) -> dict:
    if not math.isfinite(error) or error > _MAX_REL_ERROR:
        return {"status": "wrong", "rel_error": error}
    timing = measure([call], budget_ms=budget_ms)
    return {"status": "ok", "rel_error": error, "ms": timing.median_ms, "min_ms": timing.min_ms,
            "max_ms": timing.max_ms, "reps": timing.reps,
            "peak_mem_mb": peak_memory_bytes(call) / 2**20}


def _run_method(row: dict, call: Callable, ref: Dict, budget_ms: float) -> dict:
    try:
        out = call()
        torch.cuda.synchronize()
        row.update(_timed(call, relative_error(out, ref), budget_ms))
        del out
    except (RuntimeError, ValueError, NotImplementedError) as error:
        row["status"] = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
    return row


# ---- varlen ----------------------------------------------------------------------------------

def varlen_lengths(total: int, seed: int = 0) -> List[int]:
    """The benchmarks' varlen batch: random lengths in 64..3071 (the last one cut short) that add
    up to `total` tokens, the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    lengths, left = [], total
    while left > 0:
        n = min(left, int(torch.randint(64, 3072, (1,), generator=gen)))
        lengths.append(n)
        left -= n
    return lengths


def _varlen_rows(total: int, heads: int, d: int, budget_ms: float, progress) -> List[dict]:
    """samattn.varlen_attention on packed tokens (causal) vs the same sequences padded to the
    longest: samattn and SDPA (default backend) on the padded batch. Every output row is checked
    against a per-sequence fp64 reference (padding rows excluded)."""
    lengths = varlen_lengths(total)
    longest = max(lengths)
    dtype = torch.bfloat16
    cuda_gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=dtype, generator=cuda_gen)
               for _ in range(3))
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")

    def pad(t):
        padded = torch.zeros(len(lengths), longest, heads, d, device="cuda", dtype=dtype)
        for b, n in enumerate(lengths):
            padded[b, :n] = t[offsets[b]:offsets[b + 1]]
        return padded.transpose(1, 2)  # (B, H, S, D)

    qp, kp, vp = pad(q), pad(k), pad(v)
    ref = torch.empty(total, heads, d, dtype=torch.float64, device="cuda")
    for b in range(len(lengths)):
        s = slice(offsets[b], offsets[b + 1])
        qs, ks, vs = (t[s].transpose(0, 1)[None].double() for t in (q, k, v))
        ref[s] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1)

    def unpad(out):
        return torch.cat([out[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)], 0)

    methods = {
        "samattn varlen": (lambda: samattn.varlen_attention(q, k, v, cu, cu, longest, longest,
                                                            causal=True), lambda o: o),
        "samattn padded": (lambda: samattn.attention(qp, kp, vp, causal=True), unpad),
        "sdpa-default padded": (lambda: F.scaled_dot_product_attention(qp, kp, vp,
                                                                       is_causal=True), unpad),
    }
    useful = total / (len(lengths) * longest)
    label = f"varlen {len(lengths)} sequences, {total} tokens (causal)"
    flops = 4.0 * heads * d * sum(n * (n + 1) / 2 for n in lengths)
    rows = []
    for name, (call, to_packed) in methods.items():
        row = _row(label, name, flops, longest, heads, d, batch=len(lengths))
        row["useful_token_fraction"] = useful
        try:
            out = to_packed(call())
            torch.cuda.synchronize()
            error = (out.double() - ref).norm().item() / max(ref.norm().item(), 1e-300)
            row.update(_timed(call, error, budget_ms))
        except (RuntimeError, ValueError, NotImplementedError) as error:
            row["status"] = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
        rows.append(row)
        progress(row)
    varlen, padded = rows[0], rows[1]
    if varlen.get("status") == "ok" and padded.get("status") == "ok":
        # >= 0.95 is the target: padded dense time x useful fraction over the varlen time.
        varlen["vs_padded_scaled"] = padded["ms"] * useful / varlen["ms"]
    return rows


# ---- running ---------------------------------------------------------------------------------

def run(quick: bool, progress: Callable[[dict], None]) -> List[dict]:
    heads, head_dim, seqlen = 16, 128, 16384
    budget_ms = 150.0 if quick else 400.0
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    check_heads = [0, heads - 1]
    rows: List[dict] = []

    # Dense anchors: the same tensor-core family the masked calls run on, and the fastest.
    dense_case = MaskCase("dense (no mask)", lambda b, q_, k_: q_ >= 0, {})
    dense_ref = reference_rows(dense_case, q, k, v, check_heads)
    dense_flops = 4.0 * heads * head_dim * seqlen * seqlen
    dense_ms = {}
    for name, backend in (("samattn dense tensor_core", "tensor_core"),
                          ("samattn dense auto", "auto")):
        row = _run_method(_row("dense (no mask)", name, dense_flops, seqlen, heads, head_dim),
                          lambda b=backend: samattn.attention(q, k, v, backend=b), dense_ref,
                          budget_ms)
        row["density"] = 1.0
        rows.append(row)
        progress(row)
        if row.get("status") == "ok":
            dense_ms[backend] = row["ms"]
    del dense_ref

    for case in cases(quick, seqlen):
        stats = mask_statistics(case, seqlen, "cuda")
        ref = reference_rows(case, q, k, v, check_heads)
        flops = 4.0 * heads * head_dim * stats["pairs"]
        methods = {"samattn": lambda c=case: _samattn_call(c, q, k, v)}
        if case.flex:
            methods["flex"] = lambda c=case: _flex_call(c, q, k, v)
        for name, call in methods.items():
            row = _run_method(_row(case.name, name, flops, seqlen, heads, head_dim), call, ref,
                              budget_ms)
            row["density"] = stats["density"]
            if name == "samattn" and row.get("status") == "ok":
                # <= 1.2 is the target: time over f x dense time, per dense anchor.
                for backend, ms in dense_ms.items():
                    row[f"vs_density_{backend}"] = row["ms"] / (stats["density"] * ms)
            rows.append(row)
            progress(row)
        del ref
        torch.cuda.empty_cache()

    rows += _varlen_rows(seqlen, heads, head_dim, budget_ms, progress)
    for row in rows:
        if row.get("status") == "ok":
            row["tflops"] = row["flops"] / (row["ms"] * 1e-3) / 1e12
    return rows


def summary(rows: List[dict]) -> List[str]:
    """One line per issue target, from the rows (speedups filled in by runner.speedups)."""
    lines = []
    for row in rows:
        if row.get("method") != "samattn" or row.get("status") != "ok":
            continue
        parts = [f"{row['label']}: {row['ms']:.3f} ms, f = {row['density']:.3f}"]
        for key in ("vs_density_tensor_core", "vs_density_auto"):
            if key in row:
                parts.append(f"{key} {row[key]:.2f} (target <= 1.2)")
        if "speedup_vs_flex" in row:
            target = "3.0" if "strided" in row["label"] else "1.0"
            parts.append(f"vs flex {row['speedup_vs_flex']:.2f}x (target >= {target} where set)")
        lines.append("; ".join(parts))
    for row in rows:
        if "vs_padded_scaled" in row:
            lines.append(f"{row['label']}: varlen {row['ms']:.3f} ms, padded x useful fraction "
                         f"/ varlen = {row['vs_padded_scaled']:.2f} (target >= 0.95)")
    return lines
