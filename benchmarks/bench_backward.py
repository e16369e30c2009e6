"""Backward-pass timing: samattn's backward against PyTorch SDPA's FlashAttention-2 and cuDNN
backward, in one process, on the same inputs (bf16 by default, H=16, B*S = 16k tokens).

Each implementation's forward runs once outside the timed region; the timed call is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), i.e. exactly the backward kernels
of that implementation plus the gradient allocations, timed with CUDA events (warm-up, median of
>= 10 calls; samattn.bench.timing.measure). FLOPs = 2.5 x the forward's 4*B*H*S*S*D, halved when
causal (the convention of FlashAttention's benchmarks).

  python benchmarks/bench_backward.py                   # the issue's sweep
  python benchmarks/bench_backward.py --seqlens 4096 --head-dims 128 --deterministic
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn
from samattn.bench.timing import measure


def backward_flops(batch, heads, seqlen, head_dim, causal):
    forward = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return 2.5 * forward / (2 if causal else 1)


def time_backward(forward, q, k, v, dout, deterministic=False):
    """Median/min/max ms of the backward of `forward(q, k, v)`, the forward run once."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = forward(q, k, v)

    def call():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        timing = measure([call], min_reps=10, max_reps=50, budget_ms=300.0)
    finally:
        torch.use_deterministic_algorithms(previous)
    return timing


def sdpa(backend, causal):
    def forward(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return forward


def ours(causal):
    return lambda q, k, v: samattn.attention(q, k, v, causal=causal)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="batch * seqlen")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--deterministic", action="store_true",
                        help="also time samattn with torch.use_deterministic_algorithms(True)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_backward: needs a CUDA GPU", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, "
          f"H={args.heads}, B*S={args.tokens}")
    header = (f"{'D':>4} {'causal':>6} {'S':>6} {'B':>3} | {'ours ms':>8} {'TFLOPS':>7} | "
              f"{'FA2 ms':>8} {'TFLOPS':>7} | {'cuDNN ms':>8} {'TFLOPS':>7} | "
              f"{'ours/FA2':>8}" + (f" | {'det ms':>8} {'TFLOPS':>7}" if args.deterministic else ""))
    print(header)
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for head_dim in args.head_dims:
        for causal in causals:
            for seqlen in args.seqlens:
                batch = max(1, args.tokens // seqlen)
                shape = (batch, args.heads, seqlen, head_dim)
                q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype, generator=generator)
                                 for _ in range(4))
                flops = backward_flops(batch, args.heads, seqlen, head_dim, causal)
                row = dict(head_dim=head_dim, causal=causal, seqlen=seqlen, batch=batch)
                impls = [("ours", ours(causal), False),
                         ("fa2", sdpa(SDPBackend.FLASH_ATTENTION, causal), False),
                         ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, causal), False)]
                if args.deterministic:
                    impls.append(("ours_det", ours(causal), True))
                for name, forward, deterministic in impls:
                    try:
                        t = time_backward(forward, q, k, v, dout, deterministic)
                        row[name + "_ms"] = t.median_ms
                        row[name + "_tflops"] = flops / t.median_ms / 1e9
                    except RuntimeError as error:  # e.g. a backend unavailable for the shape
                        row[name + "_ms"] = float("nan")
                        row[name + "_tflops"] = float("nan")
                        row[name + "_error"] = str(error).splitlines()[0][:200]
                ratio = row["fa2_ms"] / row["ours_ms"]
                line = (f"{head_dim:>4} {str(causal):>6} {seqlen:>6} {batch:>3} | "
                        f"{row['ours_ms']:>8.3f} {row['ours_tflops']:>7.1f} | "
                        f"{row['fa2_ms']:>8.3f} {row['fa2_tflops']:>7.1f} | "
                        f"{row['cudnn_ms']:>8.3f} {row['cudnn_tflops']:>7.1f} | {ratio:>8.2f}")
                if args.deterministic:
                    line += f" | {row['ours_det_ms']:>8.3f} {row['ours_det_tflops']:>7.1f}"
                print(line, flush=True)
                rows.append(row)
                del q, k, v, dout
    for row in rows:
        for key in [k for k in row if k.endswith("_error")]:
            print(f"note: {key} at D={row['head_dim']} S={row['seqlen']}: {row[key]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
