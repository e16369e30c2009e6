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
                            return_lse=False, backend="auto", attn_mask=None, window_left=-1,
                            window_right=-1, sparse_pattern="none", sparse_block=0,
                            sparse_summary=0, block_map=None, block_q=128, block_k=128):
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
                             block_k=128):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


@torch.library.register_fake("samattn::varlen_attention_forward")
def _varlen_forward_fake(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, scale=None, causal=False, window_left=-1, window_right=-1,
                         return_lse=False, backend="auto"):
    total_q, heads, _ = query.shape
    out = query.new_empty((total_q, heads, value.shape[-1]))
    lse_shape = (heads, total_q) if return_lse else (0,)
    return out, query.new_empty(lse_shape, dtype=_lse_dtype(query.dtype))


@torch.library.register_fake("samattn::varlen_attention_backward")
def _varlen_backward_fake(dout, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k,
                          max_seqlen_q, max_seqlen_k, scale=None, causal=False, window_left=-1,
                          window_right=-1):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


# Autograd for attention_forward. The backward recomputes the probabilities from q, k and the
# forward's lse, which samattn.attention requests whenever an input requires grad; a direct call
# with return_lse=False is still differentiable, at the cost of a second forward in the
# backward. lse is an output for inspection, not differentiable.
# The mask options (attn_mask, window, sparse pattern) travel to the backward unchanged; the
# attn_mask tensor gets no gradient.
def _attention_forward_setup_context(ctx, inputs, output):
    query, key, value, scale, causal, kv_stride, _return_lse, backend = inputs[:8]
    attn_mask = inputs[8] if len(inputs) > 8 else None
    ctx.mask_options = tuple(inputs[9:])
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)
    ctx.options = (scale, causal, kv_stride, backend)
    ctx.num_inputs = len(inputs)


def _attention_forward_backward(ctx, dout, _dlse):
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    scale, causal, kv_stride, backend = ctx.options
    if lse.dim() != 3:  # the forward ran with return_lse=False
        _, lse = ops.attention_forward(query, key, value, scale, causal, kv_stride, True, backend,
                                       attn_mask, *ctx.mask_options)
    if dout.stride(-1) != 1:  # e.g. the expanded gradient of out.sum()
        dout = dout.contiguous()
    # torch.use_deterministic_algorithms(True) selects the tensor-core backward's atomic-free
    # dQ kernel (bit-identical dq across runs); the forward's backend picks the backward's.
    dq, dk, dv = ops.attention_backward(dout, query, key, value, out, lse, scale, causal,
                                        kv_stride, torch.are_deterministic_algorithms_enabled(),
                                        backend, attn_mask, *ctx.mask_options)
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


def _varlen_forward_setup_context(ctx, inputs, output):
    (query, key, value, cu_q, cu_k, max_q, max_k, scale, causal, window_left, window_right,
     _return_lse, backend) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(query, key, value, out, lse, cu_q, cu_k)
    ctx.options = (max_q, max_k, scale, causal, window_left, window_right, backend)


def _varlen_forward_backward(ctx, dout, _dlse):
    query, key, value, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, scale, causal, window_left, window_right, backend = ctx.options
    if lse.dim() != 2:  # the forward ran with return_lse=False
        _, lse = ops.varlen_attention_forward(query, key, value, cu_q, cu_k, max_q, max_k, scale,
                                              causal, window_left, window_right, True, backend)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = ops.varlen_attention_backward(dout, query, key, value, out, lse, cu_q, cu_k,
                                               max_q, max_k, scale, causal, window_left,
                                               window_right)
    return (dq, dk, dv) + (None,) * 10


torch.library.register_autograd("samattn::varlen_attention_forward", _varlen_forward_backward,
                                setup_context=_varlen_forward_setup_context)


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
torch.library.register_autograd("samattn::varlen_attention_backward",
                                _attention_backward_backward,
                                setup_context=_attention_backward_setup_context)
