"""The attention operators' autograd kernels (csrc/torch/autograd.cpp), on the CPU: what the
backward node keeps and replays (every mask option, the lse it recomputes when the forward ran
without one), when a node is recorded, torch.use_deterministic_algorithms reaching the backward
operator, double backward raising, and the op under torch.export and under torch.compile with
dynamic shapes. The gradients themselves are checked in test_backward.py and test_masks.py."""

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import samattn
from helpers import assert_close, make_qkv

ops = samattn.ops


def leaf_qkv(seqlen_q=6, seqlen_k=7, heads_q=4, heads_kv=2, dim=4, dim_v=3, seed=0):
    q, k, v = make_qkv(1, heads_q, heads_kv, seqlen_q, seqlen_k, dim, dim_v,
                       dtype=torch.float64, seed=seed)
    return [t.requires_grad_() for t in (q, k, v)]


def masked_options(q, k):
    """Every mask option attention_forward takes, at once (with causal): an additive attn_mask, a
    window, the strided Sparse Transformer pattern and a block map (with its block sizes), each
    hiding keys that the others show (9 or more rows: the window hides distance 6, the pattern
    3, 5 and 7, the block map rows 6-8's keys 2-3)."""
    generator = torch.Generator().manual_seed(3)
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    attn_mask = torch.randn(1, q.shape[1], seqlen_q, seqlen_k, dtype=torch.float64,
                            generator=generator)
    blocks = torch.ones(1, 1, seqlen_q, seqlen_k, dtype=torch.bool)
    blocks[..., 6:, 2:4] = False
    block_sparse = samattn.block_sparse_from_mask(blocks, block_q=2, block_k=2)
    return dict(attn_mask=attn_mask, window_left=4, window_right=1, sparse_pattern="strided",
                sparse_block=2, block_map=block_sparse.to_map(seqlen_k),
                block_q=block_sparse.block_q, block_k=block_sparse.block_k)


def forward(q, k, v, return_lse, **mask):
    """attention_forward through torch.ops, causal, with its arguments in the schema's order."""
    return ops.attention_forward(
        q, k, v, 0.8, True, 1, return_lse, "auto", mask.get("attn_mask"),
        mask.get("window_left", -1), mask.get("window_right", -1),
        mask.get("sparse_pattern", "none"), mask.get("sparse_block", 0), 0,
        mask.get("block_map"), mask.get("block_q", 128), mask.get("block_k", 128),
        mask.get("num_splits", 1))


def samattn_calls(graph, op):
    return [node for node in graph.nodes if node.target == op]


def described(node):
    """A traced call's arguments, every one of the schema's (the trace leaves out trailing ones
    equal to their defaults), with graph nodes named (inputs and constants by name)."""
    schema = node.target._schema.arguments
    args = list(node.args) + [argument.default_value for argument in schema[len(node.args):]]
    return tuple((a.op, str(a.target)) if isinstance(a, torch.fx.Node) else a for a in args)


def traced_replay(gradients, inputs, forward_op, backward_op, return_lse_index):
    """Traces `gradients` (a forward without lse, then its gradients) and returns the forward's
    arguments, the lse recomputation's and the backward's (described()), after checking that
    the recomputation asked for lse and that the backward received it."""
    graph = make_fx(gradients)(*inputs).graph
    forwards = samattn_calls(graph, forward_op)
    backwards = samattn_calls(graph, backward_op)
    assert len(forwards) == 2 and len(backwards) == 1
    first, recompute = (described(node) for node in forwards)
    assert first[return_lse_index] is False and recompute[return_lse_index] is True
    lse = backwards[0].args[5]
    assert lse.target is operator.getitem and lse.args == (forwards[1], 1)
    return first, recompute, described(backwards[0])


def test_backward_replays_every_option():
    """The CPU reference's backward recomputes the probabilities and reads lse only for its shape,
    so gradients cannot tell a wrong replay from a right one: the traced calls can."""
    q, k, v = leaf_qkv(seqlen_q=9, seqlen_k=10)
    mask = masked_options(q, k)
    # Each option shapes the result, so a call that lost one would be another problem.
    full = forward(q, k, v, True, **mask)[0]
    for dropped in (("attn_mask",), ("window_left",), ("sparse_pattern", "sparse_block"),
                    ("block_map", "block_q", "block_k")):
        fewer = {name: value for name, value in mask.items() if name not in dropped}
        assert not torch.allclose(forward(q, k, v, True, **fewer)[0], full), dropped

    def gradients(q, k, v):
        # num_splits (no effect on the CPU) must reach the lse recomputation too.
        return torch.autograd.grad(forward(q, k, v, False, num_splits=3, **mask)[0].sum(),
                                   (q, k, v))

    first, recompute, replayed = traced_replay(gradients, (q, k, v), ops.attention_forward.default,
                                               ops.attention_backward.default, 6)
    assert recompute[:6] == first[:6] and recompute[7:] == first[7:]
    assert first[17] == 3  # num_splits
    assert replayed[1:4] == first[0:3]  # query, key, value
    assert replayed[6:9] == first[3:6]  # scale, causal, kv_stride
    assert replayed[10:20] == first[7:17]  # backend and every mask option
    assert replayed[20:] == first[18:]  # cache_seqlens, causal_lower_right (unset here)


def test_backward_replays_cache_seqlens_bottom_right_causal_and_the_window_that_follows_it():
    q, k, v = leaf_qkv(seqlen_q=3, seqlen_k=8)
    lengths = torch.tensor([5], dtype=torch.int32)

    def call(q, k, v, return_lse, cache_seqlens, lower_right, follows=True):
        return ops.attention_forward(q, k, v, 0.8, False, 1, return_lse, "auto", None, 1, -1,
                                     "none", 0, 0, None, 128, 128, 1, cache_seqlens, lower_right,
                                     follows and lower_right)

    # Each shapes the result, so a replay that lost one would be another problem.
    full = call(q, k, v, True, lengths, True)[0]
    assert not torch.allclose(call(q, k, v, True, None, True)[0], full)
    assert not torch.allclose(call(q, k, v, True, lengths, False)[0], full)
    assert not torch.allclose(call(q, k, v, True, lengths, True, follows=False)[0], full)

    def gradients(q, k, v):
        return torch.autograd.grad(call(q, k, v, False, lengths, True)[0].sum(), (q, k, v))

    first, recompute, replayed = traced_replay(gradients, (q, k, v), ops.attention_forward.default,
                                               ops.attention_backward.default, 6)
    assert recompute[:6] == first[:6] and recompute[7:] == first[7:]
    assert first[19] is True and first[20] is True and first[18] == replayed[20]
    assert replayed[20:] == first[18:]


@pytest.mark.parametrize("causal,lower_right,follows",
                         [(True, False, False), (False, True, False), (False, True, True)],
                         ids=["top_left", "bottom_right", "bottom_right_window_follows"])
def test_varlen_backward_replays_its_options(causal, lower_right, follows):
    q, k, v = (torch.randn(9, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    options = (cu, cu, 5, 5, 0.8, causal, 2, 0)

    def gradients(q, k, v):
        out, _ = ops.varlen_attention_forward(q, k, v, *options, False, "auto", lower_right,
                                              follows)
        return torch.autograd.grad(out.sum(), (q, k, v))

    first, recompute, replayed = traced_replay(gradients, (q, k, v),
                                               ops.varlen_attention_forward.default,
                                               ops.varlen_attention_backward.default, 11)
    assert recompute[:11] == first[:11] and recompute[12:] == first[12:]
    assert first[13] is lower_right and first[14] is follows
    # The backward: (dout, q, k, v, out, lse, the forward's options..., causal_lower_right,
    # window_follows_causal).
    assert replayed[1:4] == first[0:3] and replayed[6:14] == first[3:11]
    assert replayed[14:16] == first[13:15]


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "every_mask_option"])
def test_gradients_without_a_forward_lse_equal_those_with_it(masked):
    q, k, v = leaf_qkv(seqlen_q=9, seqlen_k=10)
    mask = masked_options(q, k) if masked else {}
    out_with_lse, lse = forward(q, k, v, True, **mask)
    out_without, no_lse = forward(q, k, v, False, **mask)
    assert lse.shape == (1, 4, 9) and no_lse.shape == (0,)
    assert torch.equal(out_with_lse, out_without)
    dout = torch.randn_like(out_with_lse)
    with_lse = torch.autograd.grad(out_with_lse, (q, k, v), dout)
    recomputed = torch.autograd.grad(out_without, (q, k, v), dout)
    for got, want in zip(recomputed, with_lse):
        assert torch.isfinite(want).all() and want.abs().sum() > 0
        assert torch.equal(got, want)


def test_a_node_is_recorded_only_for_gradients():
    q, k, v = leaf_qkv()
    assert samattn.attention(q, k, v).grad_fn is not None
    with torch.no_grad():
        assert samattn.attention(q, k, v).grad_fn is None
    detached = [t.detach() for t in (q, k, v)]
    assert samattn.attention(*detached).grad_fn is None
    with torch.inference_mode():
        assert not samattn.attention(*detached).requires_grad


def test_attn_mask_requiring_grad_joins_the_graph_without_a_gradient():
    q, k, v = (t.detach() for t in leaf_qkv())
    attn_mask = torch.randn(1, 4, 6, 7, dtype=torch.float64, requires_grad=True)
    out = samattn.attention(q, k, v, attn_mask=attn_mask)
    assert out.requires_grad
    grad, = torch.autograd.grad(out.sum(), (attn_mask,), allow_unused=True)
    assert grad is None


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_algorithms_reach_the_backward_operator(deterministic):
    q, k, v = leaf_qkv()

    def gradients(q, k, v):
        return torch.autograd.grad(samattn.attention(q, k, v, causal=True).sum(), (q, k, v))

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        graph = make_fx(gradients)(q, k, v).graph
    finally:
        torch.use_deterministic_algorithms(previous)
    calls = samattn_calls(graph, ops.attention_backward.default)
    assert len(calls) == 1 and described(calls[0])[9] is deterministic


def test_varlen_double_backward_raises():
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    out = samattn.varlen_attention(q, k, v, cu, cu, 3, 3)
    dq, = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dq.sum(), (q, k, v))


def test_torch_export_keeps_the_operator():
    class Causal(torch.nn.Module):
        def forward(self, q, k, v):
            return samattn.attention(q, k, v, causal=True)

    q, k, v = (t.detach() for t in leaf_qkv())
    exported = torch.export.export(Causal(), (q, k, v))
    calls = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.attention_forward.default in calls
    assert torch.equal(exported.module()(q, k, v), samattn.attention(q, k, v, causal=True))


def test_torch_compile_with_dynamic_shapes_matches_eager_gradients():
    compiled = torch.compile(lambda q, k, v: samattn.attention(q, k, v, causal=True).square().sum(),
                             dynamic=True, fullgraph=True)
    for seqlen in (5, 9):
        q, k, v = leaf_qkv(seqlen_q=seqlen, seqlen_k=seqlen, seed=seqlen)
        got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        want = torch.autograd.grad(samattn.attention(q, k, v, causal=True).square().sum(),
                                   (q, k, v))
        for g, w in zip(got, want):
            assert_close(g, w, torch.float64)
