"""GEMM, row softmax and seed 002's unfused attention built from them.

samattn.gemm runs samattn's own GEMM kernels (CUDA) or the fp64 reference (CPU): the sm_90a
wgmma/TMA kernel for float16/bfloat16 (and float32 with allow_tf32=True) on Hopper when the
layout suits TMA, else the sm80 mma.sync tensor-core kernel for those dtypes on sm80+, else the
CUDA-core kernels (float32 stays IEEE by default). backend= forces one family.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from samattn._ops import ops

Tensor = torch.Tensor


@torch.library.register_fake("samattn::gemm")
def _gemm_fake(a, b, alpha=1.0, allow_tf32=False, backend="auto"):
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


@torch.library.register_fake("samattn::gemm_out")
def _gemm_out_fake(a, b, out, alpha=1.0, beta=0.0, allow_tf32=False, backend="auto"):
    return None


@torch.library.register_fake("samattn::softmax")
def _softmax_fake(x, scale=1.0, causal=False):
    return x.new_empty(x.shape)


def gemm(a: Tensor, b: Tensor, *, out: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 0.0, allow_tf32: bool = False, backend: str = "auto") -> Tensor:
    """alpha * a @ b (+ beta * out when out is given and beta != 0).

    a: (M, K) or (batch, M, K); b: (K, N) or (batch, K, N), same dtype (float64, float32,
    float16, bfloat16) and device. Any strides (transposed views run without a copy).
    float16/bfloat16 and float32 accumulate in float32, float64 in float64; the result has the
    inputs' dtype. allow_tf32 lets float32 run on tensor cores in TF32.
    out: written in place and returned; must have the result's shape, dtype and device.
    With beta == 0 out is never read (NaN in it does not propagate). Not differentiable: with
    out= and an input requiring grad (grad mode on) it raises; without out= gradients flow to a
    and b (GEMMs by the same kernels; allow_tf32 carries over, the backend is chosen anew).
    backend: "auto" (the fastest kernel that fits), "sm90" (wgmma + TMA: float16/bfloat16, or
    float32 with allow_tf32 and k-major operands; compute capability 9.0, 16-byte aligned
    layouts), "sm80" (mma.sync tensor cores: float16/bfloat16, or float32 with allow_tf32; any
    layout; compute capability 8.0+) or "simt" (CUDA cores, every dtype, IEEE float32). A forced
    backend that cannot run the call raises ValueError saying why. CPU tensors run the fp64
    reference whatever the backend.
    """
    if out is None:
        if beta != 0.0:
            raise ValueError("samattn.gemm: beta needs out= (the C it scales), got beta="
                             f"{beta} without out")
        return ops.gemm(a, b, alpha, allow_tf32, backend)
    ops.gemm_out(a, b, out, alpha, beta, allow_tf32, backend)
    return out


def gemm_kernel(a: Tensor, b: Tensor, *, allow_tf32: bool = False, backend: str = "auto") -> str:
    """The kernel samattn.gemm runs for these CUDA tensors: 'sm90_wgmma', 'sm80_mma', 'simt' or
    'simt_fp64'."""
    return ops.gemm_kernel(a, b, allow_tf32, backend)


def softmax(x: Tensor, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """softmax(scale * x) over the last dimension, computed in float32 (float64 for float64).

    causal: in each (rows, cols) matrix of the last two dimensions, row i sees columns j <= i
    (top-left aligned); hidden columns get 0. Returns a contiguous tensor of x's dtype.
    Differentiable (the gradient computed in float32, float64 for float64)."""
    return ops.softmax(x, scale, causal)


def _as_3d(t: Tensor, name: str) -> Tensor:
    if t.dim() == 3:
        return t
    if t.dim() == 4:
        return t.reshape(-1, t.shape[-2], t.shape[-1])
    if t.dim() == 2:
        return t.unsqueeze(0)
    raise ValueError(f"samattn.attention_unfused: {name} must be 2-D (S, D), 3-D (B, S, D) or "
                     f"4-D (B, H, S, D), got shape {tuple(t.shape)}")


def attention_unfused(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                      scale: Optional[float] = None) -> Tensor:
    """Seed 002's design: S = scale * q k^T (samattn GEMM), P = softmax(S) (samattn row softmax,
    causal masking top-left aligned), out = P v (samattn GEMM).

    q: (..., Sq, D), k: (..., Sk, D), v: (..., Sk, Dv) with equal leading dimensions (2-D, 3-D
    or 4-D). S and P are materialised in the inputs' dtype (that is the unfused design: use
    samattn.attention for the fused kernel). Not differentiable."""
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError("samattn.attention_unfused: q, k and v must have the same rank, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError("samattn.attention_unfused: q, k and v must share their leading "
                         f"dimensions, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"samattn.attention_unfused: k head_dim ({k.shape[-1]}) must equal q "
                         f"head_dim ({q.shape[-1]})")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"samattn.attention_unfused: v seq_len ({v.shape[-2]}) must equal k "
                         f"seq_len ({k.shape[-2]})")
    if k.shape[-2] < 1:
        raise ValueError("samattn.attention_unfused: k must have at least one key (seq_len >= 1)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q3, k3, v3 = _as_3d(q, "q"), _as_3d(k, "k"), _as_3d(v, "v")
    scores = ops.gemm(q3, k3.transpose(1, 2), scale, False)
    probs = ops.softmax(scores, 1.0, causal)
    out = ops.gemm(probs, v3, 1.0, False)
    return out.reshape(*q.shape[:-1], v.shape[-1])
