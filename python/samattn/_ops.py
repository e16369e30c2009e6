"""Loads the compiled operators (samattn._C) and registers their fake implementations.

The operators live in a C++ library registered with TORCH_LIBRARY(samattn, ...), their autograd
included (csrc/torch/autograd.cpp): calling them through torch.ops costs one dispatcher hop and no
Python work. Fake (meta) implementations let torch.compile trace them without running a kernel.
"""

from __future__ import annotations

import os

import torch

_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C.so")

if not os.path.exists(_LIBRARY):  # pragma: no cover - a broken install, not a code path
    raise ImportError(
        f"samattn: the compiled extension {_LIBRARY} is missing; "
        "install the package with `pip install --no-build-isolation .`"
    )
torch.ops.load_library(_LIBRARY)

ops = torch.ops.samattn


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("samattn::attention_forward")
def _attention_forward_fake(query, key, value, scale=None, causal=False, kv_stride=1,
                            return_lse=False, backend="auto", attn_mask=None, window_left=-1,
                            window_right=-1, sparse_pattern="none", sparse_block=0,
                            sparse_summary=0, block_map=None, block_q=128, block_k=128,
                            num_splits=1, cache_seqlens=None, causal_lower_right=False,
                            window_follows_causal=False):
    batch, heads, seqlen_q, _ = query.shape
    out = query.new_empty((batch, heads, seqlen_q, value.shape[-1]))
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    lse = query.new_empty(lse_shape, dtype=_lse_dtype(query.dtype))
    return out, lse


@torch.library.register_fake("samattn::attention_forward_into")
def _attention_forward_into_fake(query, key, value, out, scale=None, causal=False, kv_stride=1,
                                 backend="auto"):
    return None


@torch.library.register_fake("samattn::attention_backward")
def _attention_backward_fake(dout, query, key, value, out, lse, scale=None, causal=False,
                             kv_stride=1, deterministic=False, backend="auto", attn_mask=None,
                             window_left=-1, window_right=-1, sparse_pattern="none",
                             sparse_block=0, sparse_summary=0, block_map=None, block_q=128,
                             block_k=128, cache_seqlens=None, causal_lower_right=False,
                             window_follows_causal=False):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


@torch.library.register_fake("samattn::paged_attention_forward")
def _paged_forward_fake(query, key_cache, value_cache, block_table, cache_seqlens, scale=None,
                        causal=False, causal_lower_right=False, num_splits=1, return_lse=False,
                        backend="auto"):
    batch, heads, seqlen_q, _ = query.shape
    out = query.new_empty((batch, heads, seqlen_q, value_cache.shape[-1]))
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    return out, query.new_empty(lse_shape, dtype=_lse_dtype(query.dtype))


@torch.library.register_fake("samattn::varlen_attention_forward")
def _varlen_forward_fake(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, scale=None, causal=False, window_left=-1, window_right=-1,
                         return_lse=False, backend="auto", causal_lower_right=False,
                         window_follows_causal=False):
    total_q, heads, _ = query.shape
    out = query.new_empty((total_q, heads, value.shape[-1]))
    lse_shape = (heads, total_q) if return_lse else (0,)
    return out, query.new_empty(lse_shape, dtype=_lse_dtype(query.dtype))


@torch.library.register_fake("samattn::varlen_attention_backward")
def _varlen_backward_fake(dout, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, max_seqlen_k, scale=None, causal=False, window_left=-1,
                          window_right=-1, causal_lower_right=False,
                          window_follows_causal=False):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)
