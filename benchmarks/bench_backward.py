"""Backward-pass timing: samattn's Hopper (sm_90a) and sm80 tensor-core backwards against PyTorch
SDPA's FlashAttention-2 and cuDNN backwards, in one process, on the same inputs (bf16 by default,
H=16, B*S = 16k tokens).

Each implementation's forward runs once outside the timed region; the timed call is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), i.e. exactly the backward kernels of
that implementation plus the gradient allocations, timed with CUDA events (warm-up, median of >= 10
calls), every implementation of a shape in alternating rounds (--rounds, default 3;
samattn.bench.timing.measure_interleaved), so that the GPU's clock drift during the run is shared
among them instead of falling on whichever runs last. FLOPs = 2.5 x the forward's 4*B*H*S*S*D,
halved when causal (the convention of FlashAttention's benchmarks). Before timing, every
implementation's gradients are compared with FA2's on the same inputs: one whose max |dX - dX_FA2|
/ max |dX_FA2| exceeds 5e-2 for any gradient is reported as wrong, not timed.

  samattn-hopper: samattn.attention(..., backend="hopper")      (Hopper forward and backward)
  samattn-sm80:   samattn.attention(..., backend="tensor_core") (sm80 forward and backward)
  fa2 / cudnn:    SDPA with SDPBackend.FLASH_ATTENTION / CUDNN_ATTENTION

  python benchmarks/bench_backward.py --json $OUT/backward.json           # the issue's sweep
  python benchmarks/bench_backward.py --seqlens 4096 --head-dims 128 --deterministic
  python benchmarks/bench_backward.py --skip sm80 \
      --variant split:SAMATTN_HOPPER_BWD_VARIANT=split_dq   # a built variant as a column

A variant (--variant NAME:VAR=VALUE[:HEAD_DIMS]) is the Hopper path timed with the environment
variable VAR=VALUE set around its backward calls (the launcher reads it on every call), at the
listed head dims only (comma-separated; all if left out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn
from samattn.bench.timing import measure_interleaved

WRONG_ABOVE = 5e-2


def backward_flops(batch, heads, seqlen, head_dim, causal):
    forward = 4.0 * batch * heads * seqlen * seqlen * head_dim
    return 2.5 * forward / (2 if causal else 1)


def gradients(forward, q, k, v, dout, deterministic=False):
    """The forward's output (with its graph) and a function that runs its backward once."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = forward(q, k, v)

    def call():
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        try:
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        finally:
            torch.use_deterministic_algorithms(previous)

    return call


def sdpa(backend, causal):
    def forward(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return forward


def parse_variant(text):
    """NAME:VAR=VALUE[:D1,D2] -> (name, (var, value), head dims or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or "=" not in parts[1]:
        raise argparse.ArgumentTypeError(
            f"--variant wants NAME:VAR=VALUE[:HEAD_DIMS], got {text!r}")
    var, value = parts[1].split("=", 1)
    dims = [int(d) for d in parts[2].split(",")] if len(parts) == 3 else None
    return parts[0], (var, value), dims


class environment:
    """Sets one environment variable for a with-block (None: leaves the environment alone)."""

    def __init__(self, setting):
        self.setting = setting

    def __enter__(self):
        if self.setting is not None:
            var, value = self.setting
            self.previous = os.environ.get(var)
            os.environ[var] = value

    def __exit__(self, *exc):
        if self.setting is not None:
            var = self.setting[0]
            if self.previous is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = self.previous


def samattn_backend(backend, causal):
    return lambda q, k, v: samattn.attention(q, k, v, causal=causal, backend=backend)


def max_rel_diff(grads, reference):
    return max(((g.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-30)).item()
               for g, r in zip(grads, reference))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384, help="batch * seqlen")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--deterministic", action="store_true",
                        help="also time the Hopper backward with deterministic dq")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds over the implementations of a shape, at "
                             "least (rounded up to whole rotations: twice the implementations)")
    parser.add_argument("--budget-ms", type=float, default=300.0,
                        help="measured time per implementation and shape")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        help="NAME:VAR=VALUE[:HEAD_DIMS]: the Hopper path with VAR=VALUE set")
    parser.add_argument("--skip", nargs="*", default=[], choices=["sm80", "hopper"],
                        help="implementations not to time")
    parser.add_argument("--simt", action="store_true",
                        help="also time samattn's SIMT backward (backend=\"simt\"): what head "
                             "dims without a tensor-core backward ran")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_backward: needs a CUDA GPU", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    gpu = torch.cuda.get_device_name()
    print(f"device: {gpu}, torch {torch.__version__}, {args.dtype}, H={args.heads}, "
          f"B*S={args.tokens}; TFLOPS (ms)")
    names = [n for n in ["hopper", "sm80", "fa2", "cudnn"] if n not in args.skip]
    names += ["hopper_det"] if args.deterministic else []
    names += ["simt"] if args.simt else []
    names += [name for name, _, _ in args.variant]
    print(f"{'D':>4} {'causal':>6} {'S':>6} {'B':>3} | " +
          " | ".join(f"{n:>16}" for n in names) + " | hopper/FA2 hopper/cuDNN ours/cuDNN" +
          "".join(f" {n + '/FA2':>12}" for n, _, _ in args.variant))
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for head_dim in args.head_dims:
        for causal in causals:
            for seqlen in args.seqlens:
                batch = max(1, args.tokens // seqlen)
                shape = (batch, args.heads, seqlen, head_dim)
                q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype,
                                             generator=generator) for _ in range(4))
                flops = backward_flops(batch, args.heads, seqlen, head_dim, causal)
                row = dict(head_dim=head_dim, causal=causal, seqlen=seqlen, batch=batch,
                           heads=args.heads, dtype=args.dtype, flops=flops)
                # name -> (forward, deterministic, environment setting)
                impls = {"hopper": (samattn_backend("hopper", causal), False, None),
                         "sm80": (samattn_backend("tensor_core", causal), False, None),
                         "fa2": (sdpa(SDPBackend.FLASH_ATTENTION, causal), False, None),
                         "cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION, causal), False, None)}
                if args.deterministic:
                    impls["hopper_det"] = (samattn_backend("hopper", causal), True, None)
                if args.simt:
                    impls["simt"] = (samattn_backend("simt", causal), False, None)
                for name, setting, dims in args.variant:
                    if dims is None or head_dim in dims:
                        impls[name] = (samattn_backend("hopper", causal), False, setting)
                    else:
                        row[name + "_ms"] = row[name + "_tflops"] = float("nan")
                impls = {n: impl for n, impl in impls.items() if n not in args.skip}
                reference = None
                calls = {}  # the implementations whose gradients passed, to be timed
                for name in ["fa2"] + [n for n in impls if n != "fa2"]:
                    forward, deterministic, setting = impls[name]
                    try:
                        with environment(setting):
                            call = gradients(forward, q, k, v, dout, deterministic)
                            grads = call()
                            torch.cuda.synchronize()
                            if reference is None:
                                reference = grads
                            else:
                                diff = max_rel_diff(grads, reference)
                                row[name + "_max_rel_diff_vs_fa2"] = diff
                                if not diff <= WRONG_ABOVE:  # NaN lands here too
                                    raise RuntimeError(f"wrong gradients: max rel diff vs FA2 "
                                                       f"{diff:.3e}")
                            del grads
                            calls[name] = call
                    except (RuntimeError, ValueError) as error:  # unavailable here, or wrong
                        row[name + "_ms"] = float("nan")
                        row[name + "_tflops"] = float("nan")
                        row[name + "_error"] = str(error).splitlines()[0][:200]
                timings = measure_interleaved(
                    {name: [call] for name, call in calls.items()}, rounds=args.rounds,
                    min_reps=10, budget_ms=args.budget_ms,
                    around=lambda name: environment(impls[name][2]))
                for name, t in timings.items():
                    row[name + "_ms"] = t.median_ms
                    row[name + "_min_ms"] = t.min_ms
                    row[name + "_max_ms"] = t.max_ms
                    row[name + "_tflops"] = flops / t.median_ms / 1e9
                del calls
                torch.cuda.empty_cache()
                # "ours": what samattn runs by default (backend="auto") for this shape.
                auto = samattn.selected_backend(q, k, v, causal=causal, backward=True)
                row["ours_backend"] = auto
                mine = {"hopper": "hopper", "tensor_core": "sm80"}.get(auto)
                row["ours_ms"] = row.get(mine + "_ms", float("nan")) if mine else float("nan")
                row["ours_tflops"] = (row.get(mine + "_tflops", float("nan")) if mine
                                      else float("nan"))
                cells = " | ".join(f"{row[n + '_tflops']:>7.1f} ({row[n + '_ms']:>6.2f})"
                                   for n in names)
                hopper_ms = row.get("hopper_ms", float("nan"))  # nan: skipped or unavailable
                ratio_fa2 = row["fa2_ms"] / hopper_ms
                ratio_cudnn = row["cudnn_ms"] / hopper_ms
                row["hopper_over_fa2"] = ratio_fa2
                row["hopper_over_cudnn"] = ratio_cudnn
                row["ours_over_fa2"] = row["fa2_ms"] / row["ours_ms"]
                row["ours_over_cudnn"] = row["cudnn_ms"] / row["ours_ms"]
                variant_ratios = ""
                for name, _, _ in args.variant:
                    row[name + "_over_fa2"] = row["fa2_ms"] / row[name + "_ms"]
                    row["hopper_over_" + name] = row[name + "_ms"] / hopper_ms
                    variant_ratios += f" {row[name + '_over_fa2']:>12.2f}"
                print(f"{head_dim:>4} {str(causal):>6} {seqlen:>6} {batch:>3} | {cells} | "
                      f"{ratio_fa2:>10.2f} {ratio_cudnn:>11.2f} {row['ours_over_cudnn']:>10.2f}"
                      f"{variant_ratios}", flush=True)
                rows.append(row)
                del q, k, v, dout, reference
    for row in rows:
        for key in [k for k in row if k.endswith("_error")]:
            print(f"note: {key} at D={row['head_dim']} S={row['seqlen']} causal={row['causal']}: "
                  f"{row[key]}")
    if args.json:
        result = dict(benchmark="benchmarks/bench_backward.py " + " ".join(argv or sys.argv[1:]),
                      gpu=gpu, torch=torch.__version__, dtype=args.dtype,
                      commit=os.environ.get("SAMATTN_COMMIT", "unknown"),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                          timespec="seconds"),
                      flops_formula="2.5 * 4*B*H*S*S*D, halved when causal", rows=rows)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
