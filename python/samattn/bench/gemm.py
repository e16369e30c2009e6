"""The `gemm` suite: samattn.gemm (the automatic choice and each forced backend) against
torch.matmul (cuBLAS) in fp32 (IEEE), tf32, fp16 and bf16, square and skinny shapes.

C = A @ B with A row-major and B row-major, except tf32, whose B is a k-major view (B^T stored
row-major) so that the sm90 path can take it; torch.matmul gets the same views, with TF32
allowed exactly for the tf32 rows. Each method's output is checked once against an fp64
product (torch on the GPU) before it is timed; FLOPs are 2 M N K.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Tuple

import torch

import samattn
from samattn.bench.timing import measure, peak_memory_bytes, rotation_count

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}
# Relative L2 error against the fp64 product above which a method is reported wrong.
_MAX_REL_ERROR = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}
BACKENDS = ("auto", "sm90", "sm80", "simt")


def shapes(quick: bool) -> List[Tuple[str, int, int, int]]:
    squares = [1024, 4096] if quick else [1024, 4096, 8192]
    skinny = [64] if quick else [16, 128]
    return ([("square", s, s, s) for s in squares]
            + [("skinny", m, 8192, 8192) for m in skinny])


def _inputs(dtype_name: str, m: int, n: int, k: int, seed: int):
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    if dtype_name == "tf32":
        b = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen).T
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    return a, b, torch.empty(m, n, device="cuda", dtype=dtype)


def _methods(dtype_name: str) -> Dict[str, Tuple[Callable, Callable]]:
    """name -> (why it cannot run these inputs or None, call(a, b, out))."""
    tf32 = dtype_name == "tf32"
    methods = {}
    for backend in BACKENDS:
        name = "samattn" if backend == "auto" else f"samattn-{backend}"

        def unsupported(a, b, backend=backend):
            if backend == "simt" and tf32:
                return "the CUDA-core kernel computes IEEE float32 (the fp32 rows)"
            try:
                samattn.gemm_kernel(a, b, allow_tf32=tf32, backend=backend)
            except ValueError as error:
                return str(error).splitlines()[0][:120]
            return None

        def call(a, b, out, backend=backend):
            return samattn.gemm(a, b, out=out, allow_tf32=tf32, backend=backend)

        methods[name] = (unsupported, call)

    def torch_call(a, b, out):
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            return torch.matmul(a, b, out=out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    methods["torch.matmul"] = (lambda a, b: None, torch_call)
    return methods


def _row(dtype_name: str, kind: str, m: int, n: int, k: int, method: str) -> dict:
    return {"method": method, "label": f"gemm {dtype_name} {kind} {m}x{n}x{k}",
            "gemm": f"{dtype_name} {m}x{n}x{k}", "dtype": dtype_name, "kind": kind, "m": m,
            "n": n, "k": k, "flops": 2.0 * m * n * k, "timing": "device events"}


def run(quick: bool, progress: Callable[[dict], None]) -> List[dict]:
    rows: List[dict] = []
    for dtype_name in DTYPES:
        for kind, m, n, k in shapes(quick):
            bytes_per_set = (m * k + k * n + m * n) * torch.finfo(DTYPES[dtype_name]).bits // 8
            count = rotation_count(bytes_per_set, torch.cuda.mem_get_info()[0])
            sets = [_inputs(dtype_name, m, n, k, seed) for seed in range(count)]
            a, b, _ = sets[0]
            reference = a.double() @ b.double()
            for method, (unsupported, call) in _methods(dtype_name).items():
                row = _row(dtype_name, kind, m, n, k, method)
                reason = unsupported(a, b)
                if reason is None:
                    try:
                        row.update(_check_and_time(dtype_name, call, sets, reference, quick))
                        if method.startswith("samattn"):
                            row["kernel"] = samattn.gemm_kernel(
                                a, b, allow_tf32=dtype_name == "tf32",
                                backend=method.split("-")[1] if "-" in method else "auto")
                    except (RuntimeError, ValueError) as error:
                        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
                if reason is not None:
                    row["status"] = f"n/a ({reason})"
                rows.append(row)
                progress(row)
            del sets, reference
            torch.cuda.empty_cache()
    return rows


def _check_and_time(dtype_name, call, sets, reference, quick) -> dict:
    a, b, out = sets[0]
    out.fill_(float("nan"))  # every element must be written
    call(a, b, out)
    torch.cuda.synchronize()
    error = ((out.double() - reference).norm() / reference.norm()).item()
    if not math.isfinite(error) or error > _MAX_REL_ERROR[dtype_name]:
        return {"status": "wrong", "rel_error": error}
    calls = [lambda s=s: call(*s) for s in sets]
    timing = measure(calls, budget_ms=100.0 if quick else 300.0)
    flops = 2.0 * a.shape[0] * b.shape[1] * a.shape[1]
    return {"status": "ok", "rel_error": error, "ms": timing.median_ms,
            "min_ms": timing.min_ms, "max_ms": timing.max_ms, "reps": timing.reps,
            "tflops": flops / (timing.median_ms * 1e-3) / 1e12,
            "peak_mem_mb": peak_memory_bytes(calls[0]) / 2**20}
