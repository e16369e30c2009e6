"""torch.nn modules built on samattn's kernels."""

from __future__ import annotations

import torch
from torch import nn

from samattn.functional import attention


class StridedAttention(nn.Module):
    """Seed 000's CustomStridedAttention: multi-head self-attention in which every query attends
    to the keys at positions 0, stride, 2*stride, ...

    Input and output are (batch, seq_len, embed_dim). Projections are nn.Linear layers with
    bias, as in the seed; the attention itself is one fused samattn call on (B, S, H, D) views,
    with no transposes copied.
    """

    def __init__(self, embed_dim: int, num_heads: int, stride: int, *, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"StridedAttention: embed_dim ({embed_dim}) must be divisible by "
                             f"num_heads ({num_heads})")
        if stride < 1:
            raise ValueError(f"StridedAttention: stride must be >= 1, got {stride}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.stride = stride
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        out = attention(self._heads(self.q_proj(x)), self._heads(self.k_proj(x)),
                        self._heads(self.v_proj(x)), kv_stride=self.stride)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq_len, self.embed_dim))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, stride={self.stride}"
