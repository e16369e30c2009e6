"""Runs configurations against methods: one correctness check per (method, configuration)
against an fp64 reference, then timing and peak memory."""

from __future__ import annotations

import math
from typing import Iterable, List, Optional

import torch

from samattn.bench.configs import AttentionConfig
from samattn.bench.methods import Method
from samattn.bench.timing import host_latency, measure, peak_memory_bytes, rotation_count

# Relative L2 error above which a method's output is reported wrong instead of timed.
_MAX_REL_ERROR = {"fp64": 1e-10, "fp32": 1e-4, "fp16": 5e-3, "bf16": 3e-2}


def make_inputs(cfg: AttentionConfig, seed: int, requires_grad: bool = False):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads):
        t = torch.randn(cfg.batch, heads, cfg.seqlen, cfg.head_dim, device="cuda",
                        dtype=cfg.torch_dtype, generator=gen)
        return t.requires_grad_(requires_grad)

    return make(cfg.heads), make(cfg.kv_heads), make(cfg.kv_heads)


def reference_output(cfg: AttentionConfig, q, k, v, chunk_rows: int = 2048) -> torch.Tensor:
    """fp64 attention on the GPU (torch math), a block of query rows at a time."""
    k64 = k.detach()[:, :, ::cfg.kv_stride].double()
    v64 = v.detach()[:, :, ::cfg.kv_stride].double()
    group = cfg.heads // cfg.kv_heads
    if group > 1:
        k64, v64 = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(cfg.head_dim)
    positions = torch.arange(k64.shape[2], device=q.device) * cfg.kv_stride
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for begin in range(0, cfg.seqlen, chunk_rows):
        rows = slice(begin, min(begin + chunk_rows, cfg.seqlen))
        scores = (q.detach()[:, :, rows].double() @ k64.transpose(-1, -2)) * scale
        if cfg.causal:
            query = torch.arange(rows.start, rows.stop, device=q.device)
            scores.masked_fill_(positions[None, :] > query[:, None], float("-inf"))
        out[:, :, rows] = torch.softmax(scores, dim=-1) @ v64
        del scores
    return out


def reference_gradients(cfg: AttentionConfig, q, k, v, dout):
    """fp64 gradients of the first batch element's first key/value head and its query heads
    (an exact sub-problem: heads and batch elements do not interact), by autograd of the
    formula on the GPU. Returns (slices, (dq, dk, dv))."""
    group = cfg.heads // cfg.kv_heads
    slices = (slice(0, 1), slice(0, group)), (slice(0, 1), slice(0, 1)), \
        (slice(0, 1), slice(0, 1))
    q64, k64, v64 = (t.detach()[s].double().requires_grad_() for t, s in
                     zip((q, k, v), slices))
    kk, vv = k64[:, :, ::cfg.kv_stride], v64[:, :, ::cfg.kv_stride]
    kk, vv = kk.expand(1, group, *kk.shape[2:]), vv.expand(1, group, *vv.shape[2:])
    scores = (q64 @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(cfg.head_dim))
    if cfg.causal:
        positions = torch.arange(kk.shape[2], device=q.device) * cfg.kv_stride
        query = torch.arange(cfg.seqlen, device=q.device)
        scores = scores.masked_fill(positions[None, :] > query[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vv
    grads = torch.autograd.grad(out, (q64, k64, v64), dout.detach()[slices[0]].double())
    return slices, grads


def gradient_error(grads, reference) -> float:
    """The largest relative L2 error of the method's dq, dk, dv on the reference's slices."""
    slices, expected = reference
    return max(relative_error(g.detach()[s], e) for g, s, e in zip(grads, slices, expected))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref).norm().item()
    return diff / max(ref.norm().item(), 1e-300)


def run_config(cfg: AttentionConfig, methods: Iterable[Method], *, quick: bool = False,
               latency: bool = False, progress=None) -> List[dict]:
    """Checks and times each method on `cfg`. latency=True times back-to-back calls from Python
    on one input set (host overhead included) instead of device time on rotated inputs."""
    rows = []
    bytes_per_set = 3 * cfg.batch * cfg.heads * cfg.seqlen * cfg.head_dim * \
        torch.finfo(cfg.torch_dtype).bits // 8
    free, _ = torch.cuda.mem_get_info()
    count = 1 if latency else rotation_count(bytes_per_set, free)
    sets = [make_inputs(cfg, seed, cfg.direction == "bwd") for seed in range(count)]
    reference = reference_output(cfg, *sets[0])
    for method in methods:
        row = {"method": method.name, "label": cfg.label(), **cfg.as_dict(),
               "flops": cfg.flops(), "timing": "host latency" if latency else "device events"}
        reason = method.unsupported(cfg)
        if reason is None:
            try:
                row.update(_run_method(cfg, method, sets, reference, quick, latency))
            except (RuntimeError, NotImplementedError, ValueError) as error:
                reason = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        if reason is not None:
            row["status"] = f"n/a ({reason})"
        rows.append(row)
        if progress:
            progress(cfg, row)
        torch.cuda.empty_cache()
    return rows


def _run_method(cfg: AttentionConfig, method: Method, sets, reference, quick, latency) -> dict:
    out = method.forward(cfg, sets[0])
    torch.cuda.synchronize()
    error = relative_error(out.detach(), reference)
    if not math.isfinite(error) or error > _MAX_REL_ERROR[cfg.dtype]:
        return {"status": "wrong", "rel_error": error}
    result = {"rel_error": error}
    if cfg.direction == "fwd":
        calls = [lambda s=s: method.forward(cfg, s) for s in sets]
        memory_call = calls[0]
    else:
        if out.grad_fn is None:
            return {"status": "n/a (no backward)", "rel_error": error}
        # The gradients are checked once too, against fp64 autograd of the formula.
        dout = torch.randn(out.shape, device="cuda", dtype=out.dtype,
                           generator=torch.Generator(device="cuda").manual_seed(99))
        grads = torch.autograd.grad(out, sets[0], dout)
        grad_error = gradient_error(grads, reference_gradients(cfg, *sets[0], dout))
        result["grad_rel_error"] = grad_error
        del grads
        if not math.isfinite(grad_error) or grad_error > _MAX_REL_ERROR[cfg.dtype]:
            return {**result, "status": "wrong (gradients)"}
        calls = []
        for s in sets:
            o = method.forward(cfg, s)
            grad = torch.randn_like(o)
            calls.append(lambda o=o, s=s, g=grad: torch.autograd.grad(o, s, g, retain_graph=True))
        memory_call = calls[0]
    if latency:
        timing = host_latency(calls[0])
    else:
        timing = measure(calls, budget_ms=100.0 if quick else 200.0)
    return {**result, "status": "ok", "ms": timing.median_ms, "min_ms": timing.min_ms,
            "max_ms": timing.max_ms, "reps": timing.reps,
            "tflops": cfg.flops() / (timing.median_ms * 1e-3) / 1e12,
            "peak_mem_mb": peak_memory_bytes(memory_call) / 2**20}


def speedups(rows: List[dict], ours: str = "samattn") -> None:
    """Adds speedup_vs_<method> to each of our rows, per configuration."""
    by_config = {}
    for row in rows:
        key = tuple((k, row.get(k)) for k in ("batch", "heads", "heads_kv", "seqlen", "head_dim",
                                              "dtype", "causal", "kv_stride", "direction"))
        # masks-suite and gemm-suite rows compare within their case
        key += (("mask", row.get("mask")), ("gemm", row.get("gemm")))
        by_config.setdefault(key, []).append(row)
    for group in by_config.values():
        mine = [r for r in group if r["method"].startswith(ours) and r.get("status") == "ok"]
        for r in mine:
            for other in group:
                if other is not r and other.get("status") == "ok":
                    r[f"speedup_vs_{other['method']}"] = other["ms"] / r["ms"]


def first_ok(rows: List[dict], method: str) -> Optional[dict]:
    return next((r for r in rows if r["method"] == method and r.get("status") == "ok"), None)
