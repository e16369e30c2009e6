"""Loads the compiled operators (samattn._C) and registers their fake implementations.

The operators live in a C++ library registered with TORCH_LIBRARY(samattn, ...): calling them
through torch.ops costs one dispatcher hop and no Python work. Fake (meta) implementations let
torch.compile trace them without running a kernel.
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
                            return_lse=False, backend="auto"):
    batch, heads, seqlen_q, _ = query.shape
    out = query.new_empty((batch, heads, seqlen_q, value.shape[-1]))
    lse_shape = (batch, heads, seqlen_q) if return_lse else (0,)
    lse = query.new_empty(lse_shape, dtype=_lse_dtype(query.dtype))
    return out, lse


@torch.library.register_fake("samattn::attention_forward_into")
def _attention_forward_into_fake(query, key, value, out, scale=None, causal=False, kv_stride=1,
                                 backend="auto"):
    return None
