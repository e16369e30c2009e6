"""samattn.gemm against torch.matmul (cuBLAS through torch) in one process; writes JSON.

    python benchmarks/bench_gemm.py [--quick] [--json PATH] [--dtypes ...] [--backends ...]

Row-major C = A @ B on random inputs (never zeros), A row-major, B row-major (k-major B.T for
tf32, whose sm90 path needs k-major operands; torch gets the same views). Every dtype runs with
the automatic kernel choice, then the forced backends (--backends, default sm80) in the dtypes
they run. Each shape is checked against torch.matmul before timing; times are medians of
CUDA-event-timed calls with inputs rotated past L2 (samattn.bench.timing.measure).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import samattn
from samattn.bench.timing import measure, rotation_count

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "tf32": torch.float32, "fp64": torch.float64}


def shapes(quick: bool):
    squares = [1024, 4096, 8192] if quick else [256, 512, 1024, 2048, 4096, 8192]
    skinny = [16, 128] if quick else [16, 32, 64, 128]
    return ([("square", s, s, s) for s in squares]
            + [("skinny", m, 8192, 8192) for m in skinny])


# The dtypes each forced backend runs (the CUDA-core kernels run every dtype).
BACKEND_DTYPES = {"sm80": ("bf16", "fp16", "tf32"), "sm90": ("bf16", "fp16", "tf32"),
                  "simt": tuple(DTYPES)}


def run(name: str, kind: str, m: int, n: int, k: int, backend: str = "auto"):
    dtype = DTYPES[name]
    tf32 = name == "tf32"
    bytes_per_set = (m * k + k * n + m * n) * torch.finfo(dtype).bits // 8
    sets = rotation_count(bytes_per_set, torch.cuda.mem_get_info()[0])
    inputs = []
    for i in range(sets):
        a = torch.rand(m, k, device="cuda", dtype=dtype) * 2 - 1
        b = (torch.rand(n, k, device="cuda", dtype=dtype) * 2 - 1).T if tf32 else \
            torch.rand(k, n, device="cuda", dtype=dtype) * 2 - 1
        inputs.append((a, b, torch.empty(m, n, device="cuda", dtype=dtype)))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a, b, out = inputs[0]
        ours = samattn.gemm(a, b, allow_tf32=tf32, backend=backend)
        theirs = torch.matmul(a, b)
        rel = ((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max()).item()
        t_ours = measure([lambda x=x: samattn.gemm(x[0], x[1], out=x[2], allow_tf32=tf32,
                                                   backend=backend)
                          for x in inputs])
        t_torch = measure([lambda x=x: torch.matmul(x[0], x[1], out=x[2]) for x in inputs])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    flop = 2.0 * m * n * k
    return {"dtype": name, "kind": kind, "m": m, "n": n, "k": k, "backend": backend,
            "kernel": samattn.gemm_kernel(a, b, allow_tf32=tf32, backend=backend),
            "ours_ms": t_ours.median_ms, "torch_ms": t_torch.median_ms,
            "ours_tflops": flop / t_ours.median_ms * 1e-9,
            "torch_tflops": flop / t_torch.median_ms * 1e-9,
            "ratio": t_torch.median_ms / t_ours.median_ms, "max_rel_diff": rel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default="gemm_torch.json")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32,tf32,fp64")
    parser.add_argument("--backends", default="sm80",
                        help="forced backends to add after auto (comma-separated, or empty)")
    args = parser.parse_args()
    results = []
    print(f"device {torch.cuda.get_device_name()}; ratio = torch time / samattn time")
    print(f"{'dtype':5} {'kind':6} {'M':>6} {'N':>6} {'K':>6} {'backend':7} {'kernel':11} "
          f"{'ours TF/s':>9} {'torch':>9} {'ratio':>7} {'rel diff':>9}")
    dtypes = args.dtypes.split(",")
    plan = [("auto", name) for name in dtypes]
    for backend in filter(None, args.backends.split(",")):
        plan += [(backend, name) for name in dtypes if name in BACKEND_DTYPES[backend]]
    for backend, name in plan:
        for kind, m, n, k in shapes(args.quick):
            if name == "fp64" and m * n * k > 4096**3:
                continue  # fp64 on CUDA cores: 8192^3 alone is a TFLOP
            r = run(name, kind, m, n, k, backend)
            results.append(r)
            print(f"{name:5} {kind:6} {m:6} {n:6} {k:6} {backend:7} {r['kernel']:11} "
                  f"{r['ours_tflops']:9.1f} {r['torch_tflops']:9.1f} {r['ratio']:7.3f} "
                  f"{r['max_rel_diff']:9.2e}", flush=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "bench_gemm.py", "device": torch.cuda.get_device_name(),
                   "torch": torch.__version__, "commit": os.environ.get("SAMATTN_COMMIT", "unknown"),
                   "quick": args.quick, "results": results}, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
