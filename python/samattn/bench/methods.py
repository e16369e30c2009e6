"""The competitors: samattn's paths, torch SDPA's backends, FlexAttention, and naive PyTorch.

Each method says whether it can run a configuration (and why not) and builds a callable over
one input set. Strided attention (kv_stride > 1) is what each competitor would really be given:
SDPA and the unfused reference get the ``k[:, :, ::s]`` view, FlexAttention a mask_mod over all
keys, samattn its kv_stride option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import samattn
from samattn.bench.configs import AttentionConfig
from samattn.bench.flex import compiled_flex_attention

Inputs = tuple  # (q, k, v) with (B, H, S, D) layout


@dataclass
class Method:
    name: str
    # Returns None if the method can run the configuration, else the reason it cannot.
    unsupported: Callable[[AttentionConfig], Optional[str]]
    # Returns the forward output of the method on the inputs.
    forward: Callable[[AttentionConfig, Inputs], torch.Tensor]


def _strided_view(cfg: AttentionConfig, k, v):
    if cfg.kv_stride == 1:
        return k, v
    return k[:, :, ::cfg.kv_stride], v[:, :, ::cfg.kv_stride]


def _samattn(backend: str) -> Method:
    def unsupported(cfg):
        return None

    def forward(cfg, inputs):
        q, k, v = inputs
        return samattn.attention(q, k, v, causal=cfg.causal, kv_stride=cfg.kv_stride,
                                 backend=backend)

    return Method(f"samattn-{backend}" if backend != "auto" else "samattn", unsupported, forward)


_SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


def _sdpa(backend: str) -> Method:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = getattr(SDPBackend, _SDPA_BACKENDS[backend])

    def unsupported(cfg):
        if backend in ("flash", "cudnn") and cfg.dtype not in ("fp16", "bf16"):
            return f"{backend} supports fp16/bf16 only"
        if backend == "efficient" and cfg.dtype == "fp64":
            return "efficient supports fp32/fp16/bf16 only"
        if cfg.causal and cfg.kv_stride > 1:
            return "is_causal does not apply to a strided key view"
        if backend == "math" and cfg.seqlen * cfg.kept_keys * cfg.batch * cfg.heads * 4 > 16e9:
            return "math would materialise more than 16 GB of scores"
        return None

    def forward(cfg, inputs):
        q, k, v = inputs
        k, v = _strided_view(cfg, k, v)
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                                  enable_gqa=cfg.kv_heads != cfg.heads)

    return Method(f"sdpa-{backend}", unsupported, forward)


def _sdpa_default() -> Method:
    """What a user gets from F.scaled_dot_product_attention without choosing a backend."""

    def forward(cfg, inputs):
        q, k, v = inputs
        k, v = _strided_view(cfg, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                              enable_gqa=cfg.kv_heads != cfg.heads)

    return Method("sdpa-default", lambda cfg: None, forward)


_FLEX_CACHE: dict = {}


def _flex() -> Method:
    def unsupported(cfg):
        if cfg.dtype == "fp64":
            return "FlexAttention does not support fp64"
        return None

    def forward(cfg, inputs):
        from torch.nn.attention.flex_attention import create_block_mask

        q, k, v = inputs
        key = (cfg.batch, cfg.seqlen, cfg.causal, cfg.kv_stride)
        if key not in _FLEX_CACHE:
            stride, causal = cfg.kv_stride, cfg.causal

            def mask_mod(b, h, q_idx, kv_idx):
                visible = (kv_idx % stride) == 0
                return visible & (q_idx >= kv_idx) if causal else visible

            block_mask = None
            if causal or stride > 1:
                block_mask = create_block_mask(mask_mod, None, None, cfg.seqlen, cfg.seqlen,
                                               device=q.device)
            _FLEX_CACHE[key] = block_mask
        return compiled_flex_attention()(q, k, v, block_mask=_FLEX_CACHE[key],
                                         enable_gqa=cfg.kv_heads != cfg.heads)

    return Method("flex", unsupported, forward)


def _unfused() -> Method:
    """matmul + softmax + matmul in PyTorch: materialises the score matrix."""

    def unsupported(cfg):
        if cfg.batch * cfg.heads * cfg.seqlen * cfg.kept_keys * 4 > 16e9:
            return "would materialise more than 16 GB of scores"
        return None

    def forward(cfg, inputs):
        q, k, v = inputs
        k, v = _strided_view(cfg, k, v)
        group = cfg.heads // cfg.kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(cfg.head_dim))
        if cfg.causal:
            positions = torch.arange(k.shape[2], device=q.device) * cfg.kv_stride
            rows = torch.arange(q.shape[2], device=q.device)
            scores = scores.masked_fill(positions[None, :] > rows[:, None], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    return Method("torch-unfused", unsupported, forward)


def _samattn_unfused() -> Method:
    """Seed 002's design on samattn's own kernels: GEMM, row softmax, GEMM."""

    def unsupported(cfg):
        if cfg.kv_stride != 1 or cfg.kv_heads != cfg.heads:
            return "dense multi-head attention only"
        if cfg.direction == "bwd":
            return "not differentiable"
        if cfg.batch * cfg.heads * cfg.seqlen * cfg.kept_keys * 4 > 16e9:
            return "would materialise more than 16 GB of scores"
        return None

    def forward(cfg, inputs):
        q, k, v = inputs
        return samattn.attention_unfused(q, k, v, causal=cfg.causal)

    return Method("samattn-unfused", unsupported, forward)


def naive_strided_loop(q, k, v, stride):
    """Seed 000's naive reference: one query position per Python loop iteration."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    kept = torch.arange(0, k.shape[2], stride, device=q.device)
    k_kept, v_kept = k[:, :, kept], v[:, :, kept]
    out = torch.empty(*q.shape[:3], v.shape[-1], dtype=q.dtype, device=q.device)
    for i in range(q.shape[2]):
        scores = (q[:, :, i:i + 1] @ k_kept.transpose(-1, -2)) * scale
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        out[:, :, i] = (weights @ v_kept).squeeze(2)
    return out


def _naive_loop() -> Method:
    def unsupported(cfg):
        if cfg.causal or cfg.kv_heads != cfg.heads:
            return "the seed's loop is non-causal MHA only"
        if cfg.seqlen > 4096:
            return "too slow beyond S=4096"
        if cfg.direction == "bwd":
            return "autograd through the per-query loop is too slow to time"
        return None

    def forward(cfg, inputs):
        q, k, v = inputs
        return naive_strided_loop(q, k, v, cfg.kv_stride)

    return Method("naive-loop", unsupported, forward)


def all_methods() -> dict:
    methods = [_samattn("auto"), _samattn("simt"), _sdpa("flash"), _sdpa("cudnn"),
               _sdpa("efficient"), _sdpa("math"), _sdpa_default(), _flex(), _unfused(),
               _samattn_unfused(), _naive_loop()]
    return {m.name: m for m in methods}
