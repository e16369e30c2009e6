"""The `masks` suite: samattn's masks against FlexAttention given the same mask_mod, SDPA with
the equivalent dense boolean mask, and, for variable-length batches, the padded dense call.

Each case defines its mask once, as a vectorised function visible(b, q_idx, kv_idx) -> bool
tensor; that one definition builds FlexAttention's block mask, the dense mask handed to SDPA,
the fp64 reference (on the GPU, a block of query rows at a time) and the FLOP count (4 * D per
visible pair). Every output is checked against the reference before it is timed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import samattn
from samattn.bench.configs import DTYPES
from samattn.bench.flex import compiled_flex_attention
from samattn.bench.timing import measure, peak_memory_bytes

_MAX_REL_ERROR = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 3e-2}
_DENSE_MASK_LIMIT = 2**31  # bytes of a dense boolean mask SDPA is given at most


@dataclass
class MaskCase:
    name: str
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    visible: Callable  # (b, q_idx, kv_idx) broadcastable int tensors -> bool tensor
    samattn_options: dict
    dtype: str = "bf16"
    per_batch: bool = False  # the mask differs between batch entries
    lengths: Optional[List[int]] = None  # varlen: the sequence lengths (seqlen = the longest)
    extra: Dict = field(default_factory=dict)

    @property
    def torch_dtype(self):
        return DTYPES[self.dtype]


def _window(left):
    return lambda b, q, k: (q >= k) & (q - k <= left)


def _strided(l):
    return lambda b, q, k: (q >= k) & (((q - k) < l) | ((q - k) % l == 0))


def _fixed(l, c):
    return lambda b, q, k: (q >= k) & (((q // l) == (k // l)) | ((k % l) >= l - c))


def cases(quick: bool) -> List[MaskCase]:
    s = 4096 if quick else 16384
    out = [
        MaskCase(f"sliding window 1024 (causal) S={s}", 1, 16, s, 128, _window(1024),
                 dict(window=(1024, 0), causal=True)),
        MaskCase(f"strided l=128 (Sparse Transformer) S={s}", 1, 16, s, 128, _strided(128),
                 dict(sparse_pattern="strided", sparse_block=128)),
        MaskCase(f"fixed l=128 c=16 S={s}", 1, 16, s, 128, _fixed(128, 16),
                 dict(sparse_pattern="fixed", sparse_block=128, sparse_summary=16)),
    ]
    gen = torch.Generator().manual_seed(0)
    random_mask = torch.rand(2, 2048, 2048, generator=gen) > 0.5
    out.append(MaskCase("random boolean attn_mask 50% S=2048", 2, 16, 2048, 64,
                        _tensor_mask(random_mask), dict(), per_batch=True,
                        extra={"mask": random_mask}))
    total = 4096 if quick else 16384
    lengths, left = [], total
    while left > 0:
        n = min(left, int(torch.randint(64, 3072, (1,), generator=gen)))
        lengths.append(n)
        left -= n
    out.append(MaskCase(f"varlen {len(lengths)} sequences, {total} tokens (causal)",
                        len(lengths), 16, max(lengths), 128, None, dict(causal=True),
                        lengths=lengths))
    return out


def _tensor_mask(mask):
    def visible(b, q, k):
        m = mask.to(q.device)
        return m[b, q, k]

    return visible


# ---- mask evaluation in row blocks -----------------------------------------------------------

def _rows(case: MaskCase, b: int, begin: int, end: int, device) -> torch.Tensor:
    q = torch.arange(begin, end, device=device)[:, None]
    k = torch.arange(case.seqlen, device=device)[None, :]
    bb = torch.full_like(q, b)
    return case.visible(bb, q, k).expand(end - begin, case.seqlen)


def visible_pairs(case: MaskCase, device) -> float:
    if case.lengths is not None:
        return float(sum(n * (n + 1) // 2 for n in case.lengths))
    total = 0
    for b in range(case.batch if case.per_batch else 1):
        for begin in range(0, case.seqlen, 2048):
            total += int(_rows(case, b, begin, min(begin + 2048, case.seqlen), device).sum())
    return float(total) * (1 if case.per_batch else case.batch)


def reference(case: MaskCase, q, k, v, chunk: int = 1024) -> torch.Tensor:
    """fp64 masked attention, a block of query rows at a time (fully masked rows give 0)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    k64, v64 = k.double(), v.double()
    scale = 1.0 / math.sqrt(case.head_dim)
    for b in range(case.batch):
        for begin in range(0, case.seqlen, chunk):
            end = min(begin + chunk, case.seqlen)
            scores = (q[b:b + 1, :, begin:end].double() @ k64[b:b + 1].transpose(-1, -2)) * scale
            scores.masked_fill_(~_rows(case, b, begin, end, q.device), float("-inf"))
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            out[b:b + 1, :, begin:end] = probs @ v64[b:b + 1]
            del scores, probs
    return out


# ---- methods ---------------------------------------------------------------------------------

_FLEX = {}


def _flex_call(case: MaskCase, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask

    if case.name not in _FLEX:
        visible = case.visible

        def mask_mod(b, h, q_idx, kv_idx):
            return visible(b, q_idx, kv_idx)

        block_mask = create_block_mask(mask_mod, case.batch if case.per_batch else None, None,
                                       case.seqlen, case.seqlen, device=q.device)
        _FLEX[case.name] = block_mask
    return compiled_flex_attention()(q, k, v, block_mask=_FLEX[case.name])


def _dense_mask(case: MaskCase, device) -> torch.Tensor:
    key = ("dense", case.name)
    if key not in _FLEX:
        rows = [torch.cat([_rows(case, b, s, min(s + 2048, case.seqlen), device)
                           for s in range(0, case.seqlen, 2048)], 0)
                for b in range(case.batch if case.per_batch else 1)]
        _FLEX[key] = torch.stack(rows, 0)[:, None]  # (B|1, 1, S, S)
    return _FLEX[key]


def _methods(case: MaskCase) -> Dict[str, Callable]:
    methods = {
        "samattn": lambda q, k, v: samattn.attention(
            q, k, v, attn_mask=case.extra["mask"].to(q.device)[:, None]
            if "mask" in case.extra else None, **case.samattn_options),
        "flex": lambda q, k, v: _flex_call(case, q, k, v),
    }
    dense_bytes = (case.batch if case.per_batch else 1) * case.seqlen * case.seqlen
    if dense_bytes <= _DENSE_MASK_LIMIT:
        methods["sdpa-efficient (dense bool mask)"] = lambda q, k, v: _sdpa_masked(case, q, k, v)
    return methods


def _sdpa_masked(case, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(case, q.device))


# ---- varlen ----------------------------------------------------------------------------------

def _varlen_rows(case: MaskCase, progress) -> List[dict]:
    """samattn.varlen_attention on packed tokens vs the same sequences padded to the longest
    (samattn dense causal and SDPA flash on the padded batch; padding rows are excluded from the
    check), each checked against per-sequence fp64 references."""
    dtype = case.torch_dtype
    lengths = case.lengths
    total, longest, heads, d = sum(lengths), max(lengths), case.heads, case.head_dim
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=dtype, generator=gen)
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
    for b, n in enumerate(lengths):
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
    flops = 4.0 * heads * d * visible_pairs(case, "cuda")
    rows = []
    for name, (call, to_packed) in methods.items():
        row = _row(case, name, flops)
        try:
            out = to_packed(call())
            torch.cuda.synchronize()
            row.update(_timed(case, out, ref, [call]))
        except (RuntimeError, ValueError, NotImplementedError) as error:
            row["status"] = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
        rows.append(row)
        progress(row)
    return rows


# ---- running ---------------------------------------------------------------------------------

def _row(case: MaskCase, method: str, flops: float) -> dict:
    return {"method": method, "label": case.name, "mask": case.name, "batch": case.batch,
            "heads": case.heads, "heads_kv": 0, "seqlen": case.seqlen,
            "head_dim": case.head_dim, "dtype": case.dtype, "causal": True, "kv_stride": 1,
            "direction": "fwd", "flops": flops, "timing": "device events"}


def _timed(case: MaskCase, out, ref, calls) -> dict:
    error = (out.double() - ref).norm().item() / max(ref.norm().item(), 1e-300)
    if not math.isfinite(error) or error > _MAX_REL_ERROR[case.dtype]:
        return {"status": "wrong", "rel_error": error}
    timing = measure(calls, budget_ms=400.0)
    return {"status": "ok", "rel_error": error, "ms": timing.median_ms,
            "min_ms": timing.min_ms, "max_ms": timing.max_ms, "reps": timing.reps,
            "peak_mem_mb": peak_memory_bytes(calls[0]) / 2**20}


def run(quick: bool, progress: Callable[[dict], None]) -> List[dict]:
    rows: List[dict] = []
    for case in cases(quick):
        if case.lengths is not None:
            rows += _varlen_rows(case, progress)
            continue
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(case.batch, case.heads, case.seqlen, case.head_dim,
                               device="cuda", dtype=case.torch_dtype, generator=gen)
                   for _ in range(3))
        ref = reference(case, q, k, v)
        flops = 4.0 * case.heads * case.head_dim * visible_pairs(case, "cuda")
        for name, method in _methods(case).items():
            row = _row(case, name, flops)
            try:
                out = method(q, k, v)
                torch.cuda.synchronize()
                row.update(_timed(case, out, ref, [lambda m=method: m(q, k, v)]))
            except (RuntimeError, ValueError, NotImplementedError) as error:
                row["status"] = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
            rows.append(row)
            progress(row)
            torch.cuda.empty_cache()
    for row in rows:
        if row.get("status") == "ok":
            row["tflops"] = row["flops"] / (row["ms"] * 1e-3) / 1e12
    return rows
