"""The attention functions: samattn's native entry point, a drop-in for
torch.nn.functional.scaled_dot_product_attention, and the names the seed projects used."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from samattn._ops import ops

Tensor = torch.Tensor


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: Optional[float] = None, kv_stride: int = 1, return_lse: bool = False,
              backend: str = "auto") -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Fused attention on (batch, heads, seq_len, head_dim) tensors.

    q: (B, Hq, Sq, D); k: (B, Hkv, Sk, D); v: (B, Hkv, Sk, Dv) with Hq a multiple of Hkv
    (grouped-query attention). Any strides are accepted as long as the last dimension is
    contiguous, so (B, S, H, D) tensors can be passed as ``x.transpose(1, 2)`` without a copy.

    causal: query i sees keys j <= i (top-left aligned, like SDPA's ``is_causal``).
    scale: multiplies q.k; default 1/sqrt(D).
    kv_stride: strided attention, query i sees only keys j with j % kv_stride == 0.
    return_lse: also return the natural-log log-sum-exp of each row, (B, Hq, Sq), float32
    (float64 for float64 inputs); a row that sees no key has lse -inf and output 0.
    backend: "auto" (fastest available), "simt" or "tensor_core".

    CUDA tensors run the CUDA kernels; CPU tensors run the fp64 reference (slow, exact).

    Differentiable with respect to q, k and v (the SIMT backward on CUDA, for every dtype; the
    fp64 reference on the CPU). lse is returned for inspection and is not differentiable.
    """
    # The backward needs lse: compute it whenever autograd will record this call. getattr lets a
    # non-tensor argument reach the op's named error.
    needs_lse = return_lse or (torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
        or getattr(v, "requires_grad", False)))
    out, lse = ops.attention_forward(q, k, v, scale, causal, kv_stride, needs_lse, backend)
    return (out, lse) if return_lse else out


def selected_backend(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                     kv_stride: int = 1, backend: str = "auto") -> str:
    """Which kernel family samattn.attention would run for these CUDA tensors on this GPU:
    "simt" or "tensor_core". Forcing "simt" (argument or SAMATTN_FORCE_SIMT=1) is honoured."""
    return ops.selected_backend(q, k, v, causal, kv_stride, backend)


def _as_4d(t: Tensor, name: str) -> Tensor:
    if t.dim() == 4:
        return t
    if t.dim() == 3:
        return t.unsqueeze(0)
    if t.dim() > 4:
        return t.reshape(-1, *t.shape[-3:])
    raise ValueError(f"samattn: {name} must have at least 3 dimensions (..., L, E), "
                     f"got shape {tuple(t.shape)}")


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    Same signature and semantics for (..., H, L, E) inputs. Not yet supported (raise
    NotImplementedError): attn_mask and dropout_p > 0.
    """
    if attn_mask is not None:
        raise NotImplementedError("samattn.scaled_dot_product_attention: attn_mask is not "
                                  "supported yet; use is_causal or samattn.attention(kv_stride=)")
    if dropout_p != 0.0:
        raise NotImplementedError("samattn.scaled_dot_product_attention: dropout_p must be 0.0, "
                                  f"got {dropout_p}")
    if query.dim() < 3 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError("samattn: query, key and value must have the same rank (>= 3), got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(f"samattn: query has {query.shape[-3]} heads but key has "
                         f"{key.shape[-3]}; pass enable_gqa=True for grouped-query attention")
    out = attention(_as_4d(query, "query"), _as_4d(key, "key"), _as_4d(value, "value"),
                    causal=is_causal, scale=scale)
    return out.reshape(*query.shape[:-1], value.shape[-1])


def strided_attention(q: Tensor, k: Tensor, v: Tensor, stride: int) -> Tensor:
    """Seed 000's strided attention: query i attends to keys 0, stride, 2*stride, ...

    Computes exactly softmax(q k^T / sqrt(D)) v over the kept keys. The course's
    naive_strided_attention adds 1e-6 to the softmax denominator; samattn does not, so the two
    differ by about 1e-6 relative.
    """
    return attention(q, k, v, kv_stride=stride)


def fused_attention(Q: Tensor, K: Tensor, V: Tensor) -> Tensor:
    """Seed 001's entry point: softmax(Q K^T / sqrt(D)) V on (B, H, S, D) tensors."""
    return attention(Q, K, V)


def self_attention(x: Tensor, output: Tensor, d: int, fused: bool = True) -> Tensor:
    """Seed 002's entry point: attention of the (N, d) matrix x with itself (Q = K = V = x,
    scale 1/sqrt(d)), written into `output` (N, d). Returns `output`.

    fused=False runs seed 002's unfused design instead (samattn.attention_unfused: GEMM, row
    softmax, GEMM, with the N x N scores in memory).

    Not differentiable: it writes into `output` through attention_forward_into, which has no
    backward (use samattn.attention for gradients); x requiring grad raises RuntimeError."""
    if x.dim() != 2:
        raise ValueError(f"samattn.self_attention: x must be 2-D (N, d), got shape "
                         f"{tuple(x.shape)}")
    if x.shape[1] != d:
        raise ValueError(f"samattn.self_attention: d ({d}) must equal x.shape[1] ({x.shape[1]})")
    if output.shape != x.shape:
        raise ValueError(f"samattn.self_attention: output must have shape {tuple(x.shape)}, got "
                         f"{tuple(output.shape)}")
    if output.dtype != x.dtype or output.device != x.device:
        raise ValueError(f"samattn.self_attention: output must be {x.dtype} on {x.device}, got "
                         f"{output.dtype} on {output.device}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError("samattn.self_attention writes into `output` and is not "
                           "differentiable; use samattn.attention(q, k, v) for gradients")
    if not fused:
        from samattn.linalg import attention_unfused
        output.copy_(attention_unfused(x, x, x, scale=1.0 / math.sqrt(d)))
        return output
    view = x.view(1, 1, *x.shape)
    ops.attention_forward_into(view, view, view, output.view(1, 1, *output.shape),
                               1.0 / math.sqrt(d), False, 1, "auto")
    return output
