"""torch.nn modules built on samattn's kernels."""

from __future__ import annotations

import math

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


class MultiheadAttention(nn.Module):
    """Multi-head attention with query, key, value and output projections, on samattn's fused
    kernels. Batch-first: inputs (batch, seq_len, embed_dim), output (batch, seq_len, embed_dim).

    num_kv_heads: grouped-query attention (GQA/MQA). Key and value get num_kv_heads heads, each
    shared by num_heads // num_kv_heads query heads; the kernel reads the shared heads directly
    (no repeat). Default num_heads (standard multi-head attention).
    causal: query i sees keys j <= i (True, top-left aligned) or j <= i + Sk - Sq
    ("lower_right", for new queries against cached keys); can be overridden per call.
    kv_stride: strided attention (seed 000): query i sees keys j with j % kv_stride == 0.
    kdim, vdim: feature sizes of key and value inputs for cross-attention (default embed_dim).

    forward(query, key=None, value=None, *, causal=None, attn_mask=None,
    key_padding_mask=None, kv_cache=None, counts=None, num_splits=1): self-attention when key
    and value are omitted. kv_cache (a samattn.KVCache or PagedKVCache, self-attention only):
    generation, the new tokens' keys and values appended to it (counts: entry b's real tokens,
    the first counts[b] of a right-padded batch) and their queries attending to it, bottom-right
    causal by default. The masks follow
    torch.nn.MultiheadAttention's convention (not SDPA's): a boolean attn_mask, (L, S) or
    (batch * num_heads, L, S), is True where a query may NOT attend, a float one is added to
    the scores; key_padding_mask (batch, S) is True (or -inf) at the keys to ignore. With
    num_kv_heads == num_heads and kv_stride == 1 this computes what
    torch.nn.MultiheadAttention(batch_first=True) computes (without dropout; a row whose keys are
    all masked gives 0 here, NaN there), and load_from_torch copies such a module's weights.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, num_kv_heads: int | None = None,
                 bias: bool = True, causal: bool | str = False, kv_stride: int = 1,
                 kdim: int | None = None, vdim: int | None = None, device=None, dtype=None):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be a positive "
                             f"multiple of num_heads ({num_heads})")
        if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"MultiheadAttention: num_heads ({num_heads}) must be a multiple of "
                             f"num_kv_heads ({num_kv_heads})")
        if kv_stride < 1:
            raise ValueError(f"MultiheadAttention: kv_stride must be >= 1, got {kv_stride}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.kv_stride = kv_stride
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(kdim or embed_dim, kv_width, bias=bias, **factory)
        self.v_proj = nn.Linear(vdim or embed_dim, kv_width, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    @staticmethod
    def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
        # (B, S, H*D) -> a (B, H, S, D) view: the kernels take any strides, so nothing is copied.
        batch, seq_len, width = x.shape
        return x.view(batch, seq_len, heads, width // heads).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None,
                value: torch.Tensor | None = None, *, causal: bool | str | None = None,
                attn_mask: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None, kv_cache=None,
                counts=None, num_splits: int = 1) -> torch.Tensor:
        if query.dim() != 3:
            raise ValueError(f"MultiheadAttention: query must be (batch, seq_len, embed_dim), "
                             f"got shape {tuple(query.shape)}")
        if kv_cache is not None:
            return self._forward_cached(query, key, value, causal, attn_mask, key_padding_mask,
                                        kv_cache, counts, num_splits)
        key = query if key is None else key
        value = key if value is None else value
        batch, seq_len, _ = query.shape
        q = self._split_heads(self.q_proj(query), self.num_heads)
        k = self._split_heads(self.k_proj(key), self.num_kv_heads)
        v = self._split_heads(self.v_proj(value), self.num_kv_heads)
        mask = self._sdpa_mask(attn_mask, key_padding_mask, batch, seq_len, key.shape[1])
        out = attention(q, k, v, causal=self.causal if causal is None else causal,
                        kv_stride=self.kv_stride, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq_len, self.embed_dim))

    def _forward_cached(self, query, key, value, causal, attn_mask, key_padding_mask, kv_cache,
                        counts, num_splits):
        # Generation: the new tokens' keys and values appended to a samattn.KVCache or
        # PagedKVCache, their queries attending bottom-right causal (see samattn.kv_cache).
        if key is not None or value is not None or attn_mask is not None or \
                key_padding_mask is not None or self.kv_stride != 1:
            raise ValueError("MultiheadAttention: kv_cache takes self-attention without key, "
                             "value, attn_mask, key_padding_mask or kv_stride (the cache's "
                             "lengths and counts say which keys each entry has)")
        batch, seq_len, _ = query.shape
        q = self._split_heads(self.q_proj(query), self.num_heads)
        k = self._split_heads(self.k_proj(query), self.num_kv_heads)
        v = self._split_heads(self.v_proj(query), self.num_kv_heads)
        kv_cache.append(k, v, counts)
        out = kv_cache.attend(q, causal="lower_right" if causal is None else causal,
                              num_splits=num_splits)
        return self.out_proj(out.transpose(1, 2).reshape(batch, seq_len, self.embed_dim))

    def _sdpa_mask(self, attn_mask, key_padding_mask, batch, seq_q, seq_k):
        """torch.nn.MultiheadAttention's masks (True = hidden) as one SDPA-style mask
        broadcastable to (batch, num_heads, L, S): boolean True = attend, or additive float."""
        if attn_mask is None and key_padding_mask is None:
            return None
        masks = []
        if attn_mask is not None:
            if attn_mask.dim() == 3:
                if attn_mask.shape != (batch * self.num_heads, seq_q, seq_k):
                    raise ValueError(f"MultiheadAttention: a 3-D attn_mask must be (batch * "
                                     f"num_heads, L, S) = {(batch * self.num_heads, seq_q, seq_k)}"
                                     f", got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(batch, self.num_heads, seq_q, seq_k)
            elif attn_mask.shape != (seq_q, seq_k):
                raise ValueError(f"MultiheadAttention: attn_mask must be (L, S) = "
                                 f"{(seq_q, seq_k)} or (batch * num_heads, L, S), got "
                                 f"{tuple(attn_mask.shape)}")
            masks.append(attn_mask)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, seq_k):
                raise ValueError(f"MultiheadAttention: key_padding_mask must be (batch, S) = "
                                 f"{(batch, seq_k)}, got {tuple(key_padding_mask.shape)}")
            masks.append(key_padding_mask[:, None, None, :])
        if all(m.dtype == torch.bool for m in masks):
            hidden = masks[0] if len(masks) == 1 else masks[0] | masks[1]
            return hidden.logical_not()
        # Any float mask: every mask as an additive term (boolean True -> -inf).
        dtype = next(m.dtype for m in masks if m.dtype != torch.bool)
        total = None
        for m in masks:
            term = (torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, -math.inf)
                    if m.dtype == torch.bool else m)
            total = term if total is None else total + term
        return total

    @torch.no_grad()
    def load_from_torch(self, module: nn.MultiheadAttention) -> "MultiheadAttention":
        """Copies the projections of a torch.nn.MultiheadAttention with the same embed_dim and
        num_heads (and num_kv_heads == num_heads). Returns self."""
        if (module.embed_dim != self.embed_dim or module.num_heads != self.num_heads
                or self.num_kv_heads != self.num_heads):
            raise ValueError("MultiheadAttention.load_from_torch: needs the same embed_dim and "
                             "num_heads, and num_kv_heads == num_heads")
        if module.in_proj_weight is None:
            raise ValueError("MultiheadAttention.load_from_torch: modules with separate kdim/vdim "
                             "projections are not supported")
        for proj, weight in zip((self.q_proj, self.k_proj, self.v_proj),
                                module.in_proj_weight.chunk(3)):
            proj.weight.copy_(weight)
        if module.in_proj_bias is not None and self.q_proj.bias is not None:
            for proj, bias in zip((self.q_proj, self.k_proj, self.v_proj),
                                  module.in_proj_bias.chunk(3)):
                proj.bias.copy_(bias)
        self.out_proj.weight.copy_(module.out_proj.weight)
        if module.out_proj.bias is not None and self.out_proj.bias is not None:
            self.out_proj.bias.copy_(module.out_proj.bias)
        return self

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, causal={self.causal}, "
                f"kv_stride={self.kv_stride}")
