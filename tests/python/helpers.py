"""Shared helpers of the Python tests: the fp64 oracles, dtype tolerances and random inputs."""

from __future__ import annotations

import math

import pytest
import torch

import samattn

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

ALL_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]

# |out - ref| <= rtol * |ref| + atol * max|ref|. rtol: rounding the output to its dtype (twice the
# unit roundoff); atol: the accumulated error of fp32 (or fp64) arithmetic.
_TOLERANCE = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2.0**-10, 1e-4),
    torch.bfloat16: (2.0**-7, 1e-4),
}


def reference_attention(q, k, v, *, causal=False, scale=None, kv_stride=1):
    """samattn's fp64 CPU reference (the C++ oracle) on exact float64 copies of the inputs."""
    out, lse = samattn.ops.attention_forward(q.detach().double().cpu(), k.detach().double().cpu(),
                                             v.detach().double().cpu(), scale, causal, kv_stride,
                                             True, "auto")
    return out, lse


def torch_math_attention(q, k, v, *, causal=False, scale=None, kv_stride=1):
    """An independent oracle written with torch ops in float64 (for checking the reference)."""
    q, k, v = q.double(), k.double(), v.double()
    k, v = k[:, :, ::kv_stride], v[:, :, ::kv_stride]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        positions = torch.arange(k.shape[2], device=q.device) * kv_stride
        hidden = positions[None, :] > torch.arange(q.shape[2], device=q.device)[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                 scale_floor: float = 0.0) -> None:
    """Every element within the dtype's tolerance of the fp64 reference; NaN never passes.

    The atol term scales with max|ref|, or with scale_floor when larger: a sum of cancelling
    terms (a gradient can be exactly zero) carries rounding error of the size of its terms."""
    rtol, atol = _TOLERANCE[dtype]
    got = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} NaN elements"
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, scale_floor)
    bound = rtol * ref.abs() + atol * scale
    err = (got - ref).abs()
    bad = err > bound
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{int(bad.sum())} of {ref.numel()} elements out of tolerance ({dtype}); first at "
            f"{index}: got {got[index].item()}, expected {ref[index].item()}; max error "
            f"{err.max().item():.3e}")


_ACCUMULATION_EPS = {torch.float64: 2.0**-53}  # every other dtype accumulates in float32


def score_error_floor(q, k, v, scale, dtype) -> float:
    """A scale_floor for assert_close that covers the error of large logits: the kernels compute
    s = scale * q.k and exp2(s * log2e) in the accumulation type, so P moves by about u times the
    logit's magnitude, at most S = |scale| max_ij sum_d |q_id k_jd|, and the output by twice that
    times max|v|. Returned in units of the dtype's atol, as assert_close's floor expects."""
    u = _ACCUMULATION_EPS.get(dtype, 2.0**-24)
    if q.numel() == 0 or k.numel() == 0:
        return 0.0
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    q_abs = q.detach().double().abs()
    k_abs = k.detach().double().abs().repeat_interleave(group, 1)
    logits = abs(scale) * (q_abs @ k_abs.transpose(-1, -2)).max().item()
    return 4 * u * logits * v.detach().double().abs().max().item() / _TOLERANCE[dtype][1]


def _apply_masks(scores, visible, bias, kv_stride):
    """Adds an additive mask and hides invisible pairs; both are given over all key positions
    (..., Sq, Sk) and thinned to the kept keys like the scores."""
    if bias is not None:
        scores = scores + bias.to(scores.device).double()[..., ::kv_stride]
    if visible is not None:
        scores = scores.masked_fill(~visible.to(scores.device)[..., ::kv_stride], float("-inf"))
    return scores


def lowp_reference(q, k, v, *, causal=False, scale=None, kv_stride=1, visible=None, bias=None):
    """A same-dtype reference for tensor-core kernels: float64 arithmetic, but P = exp(s - max)
    rounded to the input dtype before P @ V (as the kernels feed P to the tensor cores), the row
    sum taken from the unrounded P, and the output rounded to the dtype. `visible` (bool) and
    `bias` (additive), broadcastable to (B, Hq, Sq, Sk), apply masks."""
    dtype = q.dtype
    if k.shape[2] == 0:  # no keys: every row is zeros
        return torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64, device=q.device)
    q64, k64, v64 = q.double(), k[:, :, ::kv_stride].double(), v[:, :, ::kv_stride].double()
    group = q.shape[1] // k.shape[1]
    k64, v64 = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        positions = torch.arange(k64.shape[2], device=q.device) * kv_stride
        hidden = positions[None, :] > torch.arange(q.shape[2], device=q.device)[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
    scores = _apply_masks(scores, visible, bias, kv_stride)
    row_max = scores.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    probs = torch.exp(scores - row_max)
    out = (probs.to(dtype).double() @ v64) / probs.sum(dim=-1, keepdim=True)
    return out.nan_to_num(nan=0.0).to(dtype).double()


_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def assert_close_tensor_core(out, ref, lowp_ref, dtype):
    """FlashAttention-3's rule for kernels that round P: the maximum error against the fp64
    reference is at most twice that of the same-dtype reference, plus one unit roundoff of the
    output scale."""
    got = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    lowp_ref = lowp_ref.detach().double().cpu()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} NaN elements"
    scale = ref.abs().max().item() if ref.numel() else 0.0
    ours = (got - ref).abs().max().item() if ref.numel() else 0.0
    baseline = (lowp_ref - ref).abs().max().item() if ref.numel() else 0.0
    bound = 2 * baseline + _UNIT_ROUNDOFF[dtype] * scale
    assert ours <= bound, (f"max error {ours:.3e} exceeds 2 x same-dtype reference error "
                           f"{baseline:.3e} + u*scale ({bound:.3e})")


def lowp_backward_reference(dout, q, k, v, out, *, causal=False, scale=None, kv_stride=1,
                            visible=None, bias=None):
    """A same-dtype reference of the tensor-core backward: float64 arithmetic on the inputs (and
    the forward's `out`, as D = rowsum(dout * out) on both sides), with the kernel's roundings:
    P rounded to the dtype before dV = P^T dO, dS = P (dP - D) (from the unrounded P) rounded to it
    before dQ = scale dS K and dK = scale dS^T Q, the gradients rounded to it. Returns
    ((dq, dk, dv), (dq_terms, dk_terms, dv_terms)): the gradients in float64 and, per element, the
    magnitude of the terms it sums (sum |P| |dO| for dV, |scale| sum P (|dP| + |D|) |Q| for dK,
    |scale| sum P (|dP| + |D|) |K| for dQ; dK, dV summed over the query heads of the group; skipped keys get zeros)."""
    dtype = q.dtype
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    q64, do64, out64 = (t.detach().double().cpu() for t in (q, dout, out))
    k_kept = k.detach().double().cpu()[:, :, ::kv_stride].repeat_interleave(group, 1)
    v_kept = v.detach().double().cpu()[:, :, ::kv_stride].repeat_interleave(group, 1)
    scores = (q64 @ k_kept.transpose(-1, -2)) * scale
    if causal:
        positions = torch.arange(k_kept.shape[2]) * kv_stride
        hidden = positions[None, :] > torch.arange(seqlen_q)[:, None]
        scores = scores.masked_fill(hidden, float("-inf"))
    scores = _apply_masks(scores, None if visible is None else visible.cpu(),
                          None if bias is None else bias.cpu(), kv_stride)
    probs = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)  # rows without keys: P = 0
    d = (do64 * out64).sum(-1, keepdim=True)
    dp = do64 @ v_kept.transpose(-1, -2)
    ds = probs * (dp - d)
    # dS = P (dP - D) cancels (to 0 when a row sees one key); its rounding error scales with the
    # terms before the cancellation, P (|dP| + |D|), D being computed from the rounded output.
    ds_terms = probs * (dp.abs() + d.abs())

    def rounded(t):
        return t.to(dtype).double()

    def per_key_head(t):  # (B, Hq, keys, D) -> (B, Hkv, seqlen_k, D), skipped keys zero
        summed = t.reshape(batch, heads_kv, group, *t.shape[2:]).sum(2)
        full = torch.zeros(batch, heads_kv, seqlen_k, t.shape[-1], dtype=torch.float64)
        full[:, :, ::kv_stride] = summed
        return full

    dq = scale * rounded(ds) @ k_kept
    dk = per_key_head(scale * rounded(ds).transpose(-1, -2) @ q64)
    dv = per_key_head(rounded(probs).transpose(-1, -2) @ do64)
    dq_terms = abs(scale) * ds_terms @ k_kept.abs()
    dk_terms = per_key_head(abs(scale) * ds_terms.transpose(-1, -2) @ q64.abs())
    dv_terms = per_key_head(probs.transpose(-1, -2) @ do64.abs())
    return (rounded(dq), rounded(dk), rounded(dv)), (dq_terms, dk_terms, dv_terms)


def assert_close_backward_tensor_core(out, ref, lowp_ref, terms, dtype, scale_floor=0.0):
    """The rule for a backward that rounds P and dS to the dtype as mma operands (the tensor-core
    backward, as FlashAttention): both of
     1. FlashAttention-3's: max |out - ref| <= 2 max |lowp_ref - ref| + u max(terms), lowp_ref from
        lowp_backward_reference (the kernel's error is its error up to fp32 arithmetic);
     2. element-wise: |out - ref| <= the dtype rule of assert_close + 2 u terms. Rounding P (or dS)
        moves each term by at most u of itself, so a correct element is off by at most u terms;
        2x is margin for fp32. A wrong term larger than that fails here even where the maximum of
        rule 1 is set by other elements.
    u is the unit roundoff (2^-8 bf16, 2^-11 fp16); terms the magnitude of the summed terms."""
    got = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    lowp_ref = lowp_ref.detach().double().cpu()
    terms = terms.detach().double().cpu()
    assert got.shape == ref.shape, f"shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} NaN elements"
    if ref.numel() == 0:
        return
    u = _UNIT_ROUNDOFF[dtype]
    rtol, atol = _TOLERANCE[dtype]
    scale = max(ref.abs().max().item(), scale_floor)
    err = (got - ref).abs()
    bound = rtol * ref.abs() + atol * scale + 2 * u * terms
    bad = err > bound
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{int(bad.sum())} of {ref.numel()} elements out of the element-wise bound ({dtype}); "
            f"first at {index}: got {got[index].item()}, expected {ref[index].item()}, same-dtype "
            f"reference {lowp_ref[index].item()}, bound {bound[index].item():.3e}")
    ours = err.max().item()
    baseline = (lowp_ref - ref).abs().max().item()
    fa3_bound = 2 * baseline + u * terms.max().item()
    assert ours <= fa3_bound, (f"max error {ours:.3e} exceeds 2 x same-dtype reference error "
                               f"{baseline:.3e} + u * max terms ({fa3_bound:.3e})")


def check_against_reference(out, q, k, v, *, backend="auto", **options):
    """Checks `out` against the fp64 reference with the rule of the kernel that produced it."""
    ref, _ = reference_attention(q, k, v, **options)
    used = samattn.selected_backend(q, k, v, causal=options.get("causal", False),
                                    kv_stride=options.get("kv_stride", 1), backend=backend)
    if used in ("tensor_core", "hopper"):  # both round P to the input dtype
        assert_close_tensor_core(out, ref, lowp_reference(q, k, v, **options), q.dtype)
    else:
        assert_close(out, ref, q.dtype)
    return used


def randn(*shape, dtype=torch.float32, device="cpu", generator=None):
    return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device=device,
                                                                            dtype=dtype)


def make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v=None, *,
             dtype=torch.float32, device="cpu", layout="bhsd", seed=0):
    """Fresh random q, k, v. layout 'bshd' returns (B, H, S, D) views of (B, S, H, D) storage."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    gen = torch.Generator().manual_seed(seed)

    def make(heads, seqlen, dim):
        if layout == "bshd":
            return randn(batch, seqlen, heads, dim, dtype=dtype, device=device,
                         generator=gen).transpose(1, 2)
        return randn(batch, heads, seqlen, dim, dtype=dtype, device=device, generator=gen)

    return (make(heads_q, seqlen_q, head_dim), make(heads_kv, seqlen_k, head_dim),
            make(heads_kv, seqlen_k, head_dim_v))
