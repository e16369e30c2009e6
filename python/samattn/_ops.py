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


@torch.library.register_fake("samattn::attention_backward")
def _attention_backward_fake(dout, query, key, value, out, lse, scale=None, causal=False,
                             kv_stride=1, deterministic=False, backend="auto"):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


# Autograd for attention_forward. The backward recomputes the probabilities from q, k and the
# forward's lse, which samattn.attention requests whenever an input requires grad; a direct call
# with return_lse=False is still differentiable, at the cost of a second forward in the
# backward. lse is an output for inspection, not differentiable.
def _attention_forward_setup_context(ctx, inputs, output):
    query, key, value, scale, causal, kv_stride, _return_lse, backend = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(query, key, value, out, lse)
    ctx.options = (scale, causal, kv_stride, backend)


def _attention_forward_backward(ctx, dout, _dlse):
    query, key, value, out, lse = ctx.saved_tensors
    scale, causal, kv_stride, backend = ctx.options
    if lse.dim() != 3:  # the forward ran with return_lse=False
        _, lse = ops.attention_forward(query, key, value, scale, causal, kv_stride, True, backend)
    if dout.stride(-1) != 1:  # e.g. the expanded gradient of out.sum()
        dout = dout.contiguous()
    # torch.use_deterministic_algorithms(True) selects the tensor-core backward's atomic-free
    # dQ kernel (bit-identical dq across runs); the forward's backend picks the backward's.
    dq, dk, dv = ops.attention_backward(dout, query, key, value, out, lse, scale, causal,
                                        kv_stride, torch.are_deterministic_algorithms_enabled(),
                                        backend)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("samattn::attention_forward", _attention_forward_backward,
                                setup_context=_attention_forward_setup_context)


# Gradients of the gradients are not implemented: without this, autograd would silently treat
# attention_backward as constant (zeros) when differentiating with create_graph=True.
def _attention_backward_setup_context(ctx, inputs, output):
    pass


def _attention_backward_backward(ctx, *grads):
    raise RuntimeError("samattn: double backward (differentiating attention_backward, e.g. "
                       "after autograd.grad(..., create_graph=True)) is not supported")


torch.library.register_autograd("samattn::attention_backward", _attention_backward_backward,
                                setup_context=_attention_backward_setup_context)
