"""Masks (issue #6): attn_mask, sliding windows, Sparse Transformer patterns and varlen batches.

Every option is checked against an fp64 oracle written here with torch ops and fed a dense
boolean mask computed from the option's definition, independently of the library. On the CPU the
library runs its fp64 reference (forward and backward); with a GPU the kernels of every dtype are
checked against that reference, plus cross-path checks (a mask equal to causal gives the causal
path, a mask equal to kv_stride gives the strided option, varlen equals one call per sequence).
"""

from __future__ import annotations

import math

import pytest
import torch

import samattn
from helpers import (ALL_DTYPES, assert_close, assert_close_backward_tensor_core,
                     assert_close_tensor_core, lowp_backward_reference, lowp_reference, make_qkv,
                     requires_cuda)

NEG_INF = float("-inf")


# ---- the definitions, written out independently of the library ------------------------------

def dense_visibility(seqlen_q, seqlen_k, *, causal=False, kv_stride=1, window=None,
                     pattern="none", block=0, summary=0):
    """(Sq, Sk) boolean: True where query i sees key j, straight from the definitions."""
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    for i in range(seqlen_q):
        for j in range(seqlen_k):
            ok = j % kv_stride == 0
            if causal or pattern != "none":
                ok = ok and j <= i
            if window is not None:
                left, right = window
                if left >= 0:
                    ok = ok and j >= i - left
                if right >= 0:
                    ok = ok and j <= i + right
            if pattern == "strided":
                ok = ok and ((i - j) < block or (i - j) % block == 0)
            elif pattern == "fixed":
                ok = ok and (j // block == i // block or j % block >= block - summary)
            visible[i, j] = ok
    return visible


def oracle(q, k, v, *, visible=None, bias=None, scale=None):
    """float64 softmax attention with torch ops. `visible` (bool, broadcastable to the scores)
    hides keys; `bias` is added. Rows with no visible key give 0 and lse -inf."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.double()
    if visible is not None:
        scores = scores.masked_fill(~visible, NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - lse.unsqueeze(-1).masked_fill(empty.unsqueeze(-1), 0.0))
    probs = probs.masked_fill(empty.unsqueeze(-1), 0.0)
    return probs @ v, lse


def reference(q, k, v, **options):
    """samattn's fp64 reference (CPU key of the op) with lse."""
    mask = options.pop("attn_mask", None)
    if mask is not None:
        mask = mask.cpu()
    return samattn.attention(q.detach().double().cpu(), k.detach().double().cpu(),
                             v.detach().double().cpu(), return_lse=True, attn_mask=mask,
                             **options)


def reference_gradients(q, k, v, out, dout, *, attn_mask=None, causal=False, kv_stride=1,
                        window=None, sparse_pattern="none", sparse_block=0, sparse_summary=0,
                        block_sparse=None):
    """The fp64 reference backward (CPU key of the op) fed the kernel's own forward output: the
    backward's D = rowsum(dO * out) then uses the same out on both sides, as in FlashAttention's
    backward (an exact out would differ by the output's rounding times |dO|)."""
    def cpu(t):
        return t.detach().double().cpu()

    q64, k64, v64 = cpu(q), cpu(k), cpu(v)
    mask = None if attn_mask is None else attn_mask.cpu()
    bs = block_sparse
    if bs is not None:
        bs = samattn.block_sparse.from_map(bs.to_map(k.shape[2]).cpu(), bs.block_q, bs.block_k)
    _, lse = samattn.attention(q64, k64, v64, return_lse=True, attn_mask=mask, causal=causal,
                               kv_stride=kv_stride, window=window, sparse_pattern=sparse_pattern,
                               sparse_block=sparse_block, sparse_summary=sparse_summary,
                               block_sparse=bs)
    left, right = window if window is not None else (-1, -1)
    extra = () if bs is None else (bs.to_map(k.shape[2]), bs.block_q, bs.block_k)
    return samattn.ops.attention_backward(cpu(dout), q64, k64, v64, cpu(out), lse, None, causal,
                                          kv_stride, False, "auto", mask, left, right,
                                          sparse_pattern, sparse_block, sparse_summary, *extra)


# Structural options: (shape (B, Hq, Hkv, Sq, Sk, D, Dv), options, definition of the mask).
PATTERNS = {
    "window_both": ((1, 2, 2, 19, 23, 5, 4), dict(window=(3, 2))),
    "window_left_causal": ((2, 2, 1, 21, 21, 4, 4), dict(window=(4, -1), causal=True)),
    "window_right_only": ((1, 1, 1, 9, 13, 3, 3), dict(window=(-1, 0))),
    "window_zero": ((1, 1, 1, 8, 8, 3, 3), dict(window=(0, 0))),
    "window_kv_stride": ((1, 2, 2, 17, 20, 4, 4), dict(window=(6, 3), kv_stride=2)),
    "strided": ((1, 2, 2, 33, 33, 4, 4), dict(sparse_pattern="strided", sparse_block=4)),
    "strided_gqa": ((2, 4, 2, 18, 18, 3, 5), dict(sparse_pattern="strided", sparse_block=5)),
    "strided_window": ((1, 1, 1, 30, 30, 4, 4),
                       dict(sparse_pattern="strided", sparse_block=3, window=(10, -1))),
    "fixed": ((1, 2, 2, 29, 29, 4, 4),
              dict(sparse_pattern="fixed", sparse_block=6, sparse_summary=2)),
    "fixed_full_summary": ((1, 1, 1, 12, 12, 3, 3),
                           dict(sparse_pattern="fixed", sparse_block=4, sparse_summary=4)),
    "fixed_sq_lt_sk": ((1, 2, 2, 10, 25, 4, 4),
                       dict(sparse_pattern="fixed", sparse_block=5, sparse_summary=1)),
}


def definition_of(options, seqlen_q, seqlen_k):
    return dense_visibility(seqlen_q, seqlen_k, causal=options.get("causal", False),
                            kv_stride=options.get("kv_stride", 1),
                            window=options.get("window"),
                            pattern=options.get("sparse_pattern", "none"),
                            block=options.get("sparse_block", 0),
                            summary=options.get("sparse_summary", 0))


def make_pattern_inputs(name, dtype=torch.float64, device="cpu", seed=1):
    shape, options = PATTERNS[name]
    q, k, v = make_qkv(*shape, dtype=dtype, device=device, seed=seed)
    return (q, k, v), dict(options), definition_of(options, shape[3], shape[4])


# ---- CPU: the reference against the definitions -----------------------------------------------

@pytest.mark.parametrize("name", list(PATTERNS))
def test_reference_pattern_matches_definition(name):
    (q, k, v), options, visible = make_pattern_inputs(name)
    out, lse = reference(q, k, v, **options)
    want_out, want_lse = oracle(q, k, v, visible=visible)
    assert_close(out, want_out, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert_close(lse[finite], want_lse[finite], torch.float64)


@pytest.mark.parametrize("name", list(PATTERNS))
def test_reference_pattern_equals_its_dense_boolean_mask(name):
    """Cross path on the reference: the option and attn_mask = its definition agree."""
    (q, k, v), options, visible = make_pattern_inputs(name)
    out, lse = reference(q, k, v, **options)
    kv_stride = options.get("kv_stride", 1)
    mask_out, mask_lse = reference(q, k, v, attn_mask=visible)
    assert_close(out, mask_out, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(mask_lse))
    del kv_stride


def test_causal_mask_equals_causal_option():
    q, k, v = make_qkv(2, 2, 1, 13, 13, 4, dtype=torch.float64, seed=3)
    causal = torch.ones(13, 13, dtype=torch.bool).tril()
    assert_close(reference(q, k, v, attn_mask=causal)[0], reference(q, k, v, causal=True)[0],
                 torch.float64)


def test_kv_stride_mask_equals_kv_stride_option():
    q, k, v = make_qkv(1, 2, 2, 9, 14, 4, dtype=torch.float64, seed=4)
    strided = dense_visibility(9, 14, kv_stride=3)
    assert_close(reference(q, k, v, attn_mask=strided)[0], reference(q, k, v, kv_stride=3)[0],
                 torch.float64)


@pytest.mark.parametrize("mask_shape", [(13, 17), (1, 13, 17), (2, 1, 13, 17), (1, 3, 1, 17),
                                        (2, 3, 13, 17), (13, 1)])
@pytest.mark.parametrize("kind", ["bool", "float32", "float64"])
def test_sdpa_attn_mask_matches_torch(mask_shape, kind):
    q, k, v = make_qkv(2, 3, 3, 13, 17, 8, dtype=torch.float64, seed=5)
    gen = torch.Generator().manual_seed(6)
    if kind == "bool":
        mask = torch.rand(mask_shape, generator=gen) > 0.3
        # Every row keeps key 0 visible, so torch (NaN on empty rows) is comparable.
        mask[..., 0] = True
    else:
        mask = torch.randn(mask_shape, generator=gen, dtype=getattr(torch, kind))
    got = samattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if kind == "bool":
        want, _ = oracle(q, k, v, visible=mask)
    else:
        want, _ = oracle(q, k, v, bias=mask)
    assert_close(got, want, torch.float64)
    if kind != "float32":
        # torch 2.11's math SDPA mishandles a float32 mask on float64 inputs (it returns values
        # far from softmax(qk^T * scale + mask) v), so torch is only compared on the others.
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert_close(got, theirs, torch.float64)


def test_attn_mask_any_strides():
    """A transposed (non-contiguous) mask and an expanded one (stride 0) read correctly."""
    q, k, v = make_qkv(2, 2, 2, 11, 11, 4, dtype=torch.float64, seed=7)
    gen = torch.Generator().manual_seed(8)
    base = torch.randn(2, 2, 11, 11, generator=gen, dtype=torch.float64)
    transposed = base.transpose(-1, -2)
    assert not transposed.is_contiguous()
    want, _ = oracle(q, k, v, bias=transposed)
    assert_close(samattn.attention(q, k, v, attn_mask=transposed), want, torch.float64)
    row = torch.randn(11, generator=gen, dtype=torch.float64)
    expanded = row.expand(2, 2, 11, 11)
    assert expanded.stride() == (0, 0, 0, 1)
    want, _ = oracle(q, k, v, bias=expanded)
    assert_close(samattn.attention(q, k, v, attn_mask=expanded), want, torch.float64)


def test_mask_combines_with_causal_and_window():
    q, k, v = make_qkv(1, 2, 2, 15, 15, 4, dtype=torch.float64, seed=9)
    gen = torch.Generator().manual_seed(10)
    mask = torch.rand(15, 15, generator=gen) > 0.4
    visible = mask & dense_visibility(15, 15, causal=True, window=(5, -1))
    got, lse = reference(q, k, v, attn_mask=mask, causal=True, window=(5, -1))
    want, want_lse = oracle(q, k, v, visible=visible)
    assert_close(got, want, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))


def test_fully_masked_rows_give_zero_and_neg_inf_cpu():
    q, k, v = make_qkv(1, 2, 2, 6, 7, 4, dtype=torch.float64, seed=11)
    for t in (q, k, v):
        t.requires_grad_()
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[2] = False
    additive = torch.zeros(6, 7, dtype=torch.float64)
    additive[4] = NEG_INF
    for m, row in ((mask, 2), (additive, 4)):
        out, lse = samattn.attention(q, k, v, attn_mask=m, return_lse=True)
        assert torch.all(out[:, :, row] == 0)
        assert torch.all(torch.isneginf(lse[:, :, row]))
        assert not torch.isnan(out).any()
        dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
        assert torch.all(dq[:, :, row] == 0)
        for g in (dq, dk, dv):
            assert not torch.isnan(g).any()


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_gradients_match_torch_autograd(name):
    (q, k, v), options, visible = make_pattern_inputs(name)
    for t in (q, k, v):
        t.requires_grad_()
    dout = torch.randn(*q.shape[:3], v.shape[-1], dtype=torch.float64,
                       generator=torch.Generator().manual_seed(12))
    ours = torch.autograd.grad(samattn.attention(q, k, v, **options), (q, k, v), dout)
    theirs = torch.autograd.grad(oracle(q, k, v, visible=visible)[0], (q, k, v), dout)
    for got, want in zip(ours, theirs):
        assert_close(got, want, torch.float64)


@pytest.mark.parametrize("name", ["window_both", "strided", "fixed"])
def test_pattern_gradcheck(name):
    (q, k, v), options, _ = make_pattern_inputs(name)
    q, k, v = (t[:, :, :10].contiguous().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: samattn.attention(q, k, v, **options),
                                    (q, k, v))


def test_attn_mask_gradients_float_and_bool():
    q, k, v = make_qkv(1, 2, 2, 7, 9, 3, dtype=torch.float64, seed=13)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    gen = torch.Generator().manual_seed(14)
    bias = torch.randn(2, 7, 9, generator=gen, dtype=torch.float64)
    boolean = torch.rand(7, 9, generator=gen) > 0.5
    for kwargs in (dict(bias=bias), dict(visible=boolean)):
        mask = kwargs.get("bias", kwargs.get("visible"))
        ours = torch.autograd.grad(samattn.attention(q, k, v, attn_mask=mask).sum(), (q, k, v))
        theirs = torch.autograd.grad(oracle(q, k, v, **kwargs)[0].sum(), (q, k, v))
        for got, want in zip(ours, theirs):
            assert_close(got, want, torch.float64, scale_floor=1.0)


def test_fused_attention_with_mask():
    q, k, v = make_qkv(2, 2, 2, 8, 8, 4, dtype=torch.float64, seed=15)
    mask = torch.rand(8, 8, generator=torch.Generator().manual_seed(16)) > 0.5
    mask[:, 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(samattn.fused_attention_with_mask(q, k, v, mask), want, torch.float64)


# ---- CPU: validation -------------------------------------------------------------------------

def test_validation_errors_name_the_argument():
    q, k, v = make_qkv(1, 2, 2, 5, 6, 4, dtype=torch.float32, seed=17)
    with pytest.raises(TypeError, match="attn_mask dtype"):
        samattn.attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.int32))
    with pytest.raises(TypeError, match="attn_mask dtype must be bool, float32 or the query"):
        samattn.attention(q, k, v, attn_mask=torch.ones(5, 6, dtype=torch.float16))
    with pytest.raises(ValueError, match="not broadcastable"):
        samattn.attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="not broadcastable"):
        samattn.attention(q, k, v, attn_mask=torch.ones(3, 2, 5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask must have 2 to 4"):
        samattn.attention(q, k, v, attn_mask=torch.ones(6, dtype=torch.bool))
    with pytest.raises(ValueError, match="window_left must be >= 0 or -1"):
        samattn.attention(q, k, v, window=(-2, 0))
    with pytest.raises(ValueError, match="window_right must be >= 0 or -1"):
        samattn.attention(q, k, v, window=(0, -5))
    with pytest.raises(ValueError, match="window must be a pair"):
        samattn.attention(q, k, v, window=3)
    with pytest.raises(ValueError, match="'strided' needs block"):
        samattn.attention(q, k, v, sparse_pattern="strided", sparse_block=0)
    with pytest.raises(ValueError, match="'fixed' needs summary"):
        samattn.attention(q, k, v, sparse_pattern="fixed", sparse_block=4, sparse_summary=5)
    with pytest.raises(ValueError, match="sparse_pattern must be one of"):
        samattn.attention(q, k, v, sparse_pattern="diagonal", sparse_block=4)
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        samattn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6).bool(),
                                             is_causal=True)


# ---- varlen ----------------------------------------------------------------------------------

def make_varlen(lengths_q, lengths_k, heads_q=2, heads_kv=1, dim=4, dim_v=3,
                dtype=torch.float64, device="cpu", seed=20):
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.randn(total_q, heads_q, dim, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(total_k, heads_kv, dim, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(total_k, heads_kv, dim_v, generator=gen).to(device=device, dtype=dtype)

    def cumulative(lengths):
        return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                            device=device)

    return q, k, v, cumulative(lengths_q), cumulative(lengths_k)


def per_sequence(q, k, v, cu_q, cu_k, **options):
    """One dense reference call per sequence, stitched together: out (total_q, H, Dv) and lse
    (H, total_q)."""
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].transpose(0, 1).unsqueeze(0)
        ks = k[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        vs = v[ck[b]:ck[b + 1]].transpose(0, 1).unsqueeze(0)
        out, lse = samattn.attention(qs.double().cpu(), ks.double().cpu(), vs.double().cpu(),
                                     return_lse=True, **options)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def per_sequence_lowp(q, k, v, cu_q, cu_k, **options):
    """helpers.lowp_reference (P rounded to the dtype) per sequence with the options' mask,
    stitched like per_sequence."""
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0).detach().cpu()
                      for t, lo, hi in ((q, cq[b], cq[b + 1]), (k, ck[b], ck[b + 1]),
                                        (v, ck[b], ck[b + 1])))
        visible = structure_of(options, qs.shape[2], ks.shape[2])
        outs.append(lowp_reference(qs, ks, vs, visible=visible)[0].transpose(0, 1))
    return torch.cat(outs, 0)


VARLEN_CASES = {
    "mixed": ([5, 1, 9, 3], [5, 1, 9, 3], {}),
    "causal": ([7, 2, 6], [7, 2, 6], dict(causal=True)),
    "cross_lengths": ([3, 6, 2], [8, 1, 5], {}),
    "zero_lengths": ([0, 4, 0, 3], [2, 4, 0, 0], {}),
    "window": ([11, 4], [11, 4], dict(window=(2, 1))),
    # Bottom-right causal per sequence: Sk > Sq, Sk == Sq, Sq > Sk (leading rows see no key),
    # Sk == 0, Sq == 0; the dense calls it is compared with run samattn.attention's own mapping
    # of "lower_right" (a window, or causal on trailing rows).
    "lower_right": ([3, 6, 5, 2, 0], [8, 6, 2, 0, 3], dict(causal="lower_right")),
    "lower_right_window": ([9, 4, 7], [12, 2, 7], dict(causal="lower_right", window=(3, -1))),
}


@pytest.mark.parametrize("name", list(VARLEN_CASES))
def test_varlen_reference_equals_per_sequence_calls(name):
    lengths_q, lengths_k, options = VARLEN_CASES[name]
    q, k, v, cu_q, cu_k = make_varlen(lengths_q, lengths_k)
    out, lse = samattn.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                        return_lse=True, **options)
    want, want_lse = per_sequence(q, k, v, cu_q, cu_k, **options)
    assert_close(out, want, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert_close(lse[finite], want_lse[finite], torch.float64)


@pytest.mark.parametrize("name", list(VARLEN_CASES))
def test_varlen_gradients_equal_per_sequence(name):
    lengths_q, lengths_k, options = VARLEN_CASES[name]
    q, k, v, cu_q, cu_k = make_varlen(lengths_q, lengths_k)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64,
                       generator=torch.Generator().manual_seed(21))
    ours = torch.autograd.grad(
        samattn.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **options),
        (q, k, v), dout)
    theirs = torch.autograd.grad(per_sequence(q, k, v, cu_q, cu_k, **options)[0], (q, k, v),
                                 dout)
    for got, want in zip(ours, theirs):
        assert_close(got, want, torch.float64, scale_floor=1.0)


def test_varlen_gradcheck():
    q, k, v, cu_q, cu_k = make_varlen([3, 0, 4], [2, 3, 4])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.varlen_attention(q, k, v, cu_q, cu_k, 4, 4, causal=True),
        (q, k, v))


def test_varlen_lower_right_gradcheck():
    q, k, v, cu_q, cu_k = make_varlen([2, 4, 3], [5, 4, 1])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.varlen_attention(q, k, v, cu_q, cu_k, 4, 5, causal="lower_right"),
        (q, k, v))


def test_varlen_lower_right_differs_from_top_left_where_lengths_differ():
    # The option reaches the kernels: sequence 0 (Sq 2, Sk 5) sees 3 more keys per row.
    q, k, v, cu_q, cu_k = make_varlen([2, 3], [5, 3])
    lower = samattn.varlen_attention(q, k, v, cu_q, cu_k, 3, 5, causal="lower_right")
    upper = samattn.varlen_attention(q, k, v, cu_q, cu_k, 3, 5, causal=True)
    assert not torch.allclose(lower[:2], upper[:2])
    assert torch.equal(lower[2:], upper[2:])  # Sq == Sk: the two alignments agree
    with pytest.raises(ValueError, match="causal must be a bool, 'upper_left' or 'lower_right'"):
        samattn.varlen_attention(q, k, v, cu_q, cu_k, 3, 5, causal="bottom")


def test_varlen_validation():
    q, k, v, cu_q, cu_k = make_varlen([3, 4], [3, 4])
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        samattn.varlen_attention(q, k, v, cu_q.long(), cu_k, 4, 4)
    with pytest.raises(ValueError, match="non-decreasing"):
        samattn.varlen_attention(q, k, v, torch.tensor([0, 5, 3, 7], dtype=torch.int32),
                                 torch.tensor([0, 3, 3, 7], dtype=torch.int32), 5, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] \(6\) must equal the total"):
        samattn.varlen_attention(q, k, v, cu_q, torch.tensor([0, 3, 6], dtype=torch.int32), 4, 4)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0"):
        samattn.varlen_attention(q, k, v, torch.tensor([1, 3, 7], dtype=torch.int32), cu_k, 4, 4)
    with pytest.raises(ValueError, match="same length"):
        samattn.varlen_attention(q, k, v, cu_q, torch.tensor([0, 7], dtype=torch.int32), 4, 7)
    with pytest.raises(ValueError, match="max_seqlen_q is 3"):
        samattn.varlen_attention(q, k, v, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="query must be 3-D"):
        samattn.varlen_attention(q.unsqueeze(0), k, v, cu_q, cu_k, 4, 4)


# ---- GPU: the kernels against the fp64 reference ---------------------------------------------

GPU_DTYPES = ALL_DTYPES
HALF_DTYPES = [torch.float16, torch.bfloat16]
TC_BACKWARD_DIMS = (32, 64, 96, 128)


def gpu_pattern_inputs(name, dtype, seed=31):
    (q, k, v), options, visible = make_pattern_inputs(name, dtype=dtype, device="cuda",
                                                      seed=seed)
    return (q, k, v), options, visible


def structure_of(options, seqlen_q, seqlen_k):
    """The options' (Sq, Sk) visibility, vectorised (samattn.block_sparse.pattern_visibility
    follows the same definitions as dense_visibility) plus kv_stride."""
    rows = torch.arange(seqlen_q)[:, None]
    cols = torch.arange(seqlen_k)[None, :]
    causal = options.get("causal", False)
    lower_right = causal == "lower_right"
    visible = samattn.block_sparse.pattern_visibility(
        rows, cols, causal=bool(causal) and not lower_right, window=options.get("window"),
        sparse_pattern=options.get("sparse_pattern", "none"),
        sparse_block=options.get("sparse_block", 0),
        sparse_summary=options.get("sparse_summary", 0))
    if lower_right:  # written out from the definition: j <= i + Sk - Sq
        visible = visible & (cols <= rows + seqlen_k - seqlen_q)
    return visible & (cols % options.get("kv_stride", 1) == 0)


def dense_masks(q, k, options, attn_mask=None, block_sparse=None):
    """(visible, bias) broadcastable to (B, Hq, Sq, Sk): the structure, a boolean attn_mask and
    the block map hide pairs; a float attn_mask is added."""
    visible = structure_of(options, q.shape[2], k.shape[2])
    bias = None
    if attn_mask is not None:
        mask = attn_mask.cpu()
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            bias = mask.double()
    if block_sparse is not None:
        visible = visible & block_visibility(block_sparse, q.shape[2], k.shape[2])
    return visible, bias


def uses_tensor_cores(q, k, v, options, attn_mask=None, block_sparse=None, backend="auto"):
    """True when the forward runs on the sm80 masked kernel or (a sliding window with kv_stride
    1) the Hopper one: both round P to the dtype, so both take the tensor-core rule."""
    return samattn.selected_backend(q, k, v, backend=backend, attn_mask=attn_mask,
                                    block_sparse=block_sparse, **options) in ("tensor_core",
                                                                              "hopper")


def check_forward(out, lse, q, k, v, options, *, attn_mask=None, block_sparse=None,
                  backend="auto"):
    """out and lse against the fp64 reference, with the rule of the kernel that ran: the
    tensor-core kernels round P, so their bound is FlashAttention-3's against a same-dtype
    reference given the same masks."""
    bs_cpu = None if block_sparse is None else samattn.block_sparse.from_map(
        block_sparse.to_map(k.shape[2]).cpu(), block_sparse.block_q, block_sparse.block_k)
    want, want_lse = reference(q, k, v, attn_mask=attn_mask, block_sparse=bs_cpu, **options)
    if uses_tensor_cores(q, k, v, options, attn_mask, block_sparse, backend):
        visible, bias = dense_masks(q, k, options, attn_mask, bs_cpu)
        lowp = lowp_reference(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(),
                              visible=visible, bias=bias)
        assert_close_tensor_core(out, want, lowp, q.dtype)
    else:
        assert_close(out, want, q.dtype)
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse.cpu().double()[finite], want_lse[finite], rtol=1e-5, atol=1e-5)


def check_gradients(grads, q, k, v, out, dout, options, *, attn_mask=None, block_sparse=None):
    """dq, dk, dv against the reference backward fed the kernel's out; the tensor-core backward
    (float16/bfloat16, head dims 32-128) under its rounding rule."""
    bs_cpu = None if block_sparse is None else samattn.block_sparse.from_map(
        block_sparse.to_map(k.shape[2]).cpu(), block_sparse.block_q, block_sparse.block_k)
    want = reference_gradients(q, k, v, out, dout, attn_mask=attn_mask, block_sparse=block_sparse,
                               **options)
    tensor_core = (uses_tensor_cores(q, k, v, options, attn_mask, block_sparse)
                   and q.shape[-1] in TC_BACKWARD_DIMS and q.shape[-1] == v.shape[-1])
    if tensor_core:
        visible, bias = dense_masks(q, k, options, attn_mask, bs_cpu)
        lowp, terms = lowp_backward_reference(dout, q, k, v, out,
                                              kv_stride=options.get("kv_stride", 1),
                                              visible=visible, bias=bias)
        for got, ref, low, term in zip(grads, want, lowp, terms):
            assert_close_backward_tensor_core(got, ref, low, term, q.dtype, scale_floor=1.0)
    else:
        for got, ref in zip(grads, want):
            assert_close(got, ref, q.dtype, scale_floor=1.0)


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gpu_pattern_forward(name, dtype):
    (q, k, v), options, _ = gpu_pattern_inputs(name, dtype)
    out, lse = samattn.attention(q, k, v, return_lse=True, **options)
    check_forward(out, lse, q, k, v, options)


@requires_cuda
def test_gpu_forcing_tensor_cores_on_unsupported_masked_calls_raises():
    (q, k, v), options, _ = gpu_pattern_inputs("strided", torch.float64)
    with pytest.raises(ValueError, match="backend tensor_core does not support"):
        samattn.attention(q, k, v, backend="tensor_core", **options)


def heavy(value):
    """A parameter whose case takes seconds (long sequences, fp64 CPU reference): marked so
    quick device scripts can deselect it (-m "not heavy"); full runs keep it."""
    return pytest.param(value, marks=pytest.mark.heavy)


# Every option on the tensor cores, at head dims they take, with awkward lengths.
TC_PATTERNS = {
    "causal_mask_s1": ((2, 2, 2, 1, 1, 64), dict(window=(0, 0))),
    "window_77": ((1, 4, 2, 77, 77, 64), dict(window=(20, 3))),
    "window_causal_1000": ((1, 2, 2, 1000, 1000, 128), dict(window=(100, -1), causal=True)),
    "window_sq_gt_sk": ((1, 2, 2, 129, 77, 96), dict(window=(40, -1), causal=True)),
    "window_sq_ne_sk": ((1, 2, 1, 129, 300, 32), dict(window=(50, 60))),
    "window_kv_stride": ((1, 2, 2, 200, 230, 64), dict(window=(70, 10), kv_stride=3)),
    "strided_l16_129": ((1, 2, 2, 129, 129, 64), dict(sparse_pattern="strided", sparse_block=16)),
    "strided_l128_1000": ((1, 2, 2, 1000, 1000, 128),
                          dict(sparse_pattern="strided", sparse_block=128)),
    "strided_l100_gqa": ((2, 4, 2, 333, 333, 96), dict(sparse_pattern="strided",
                                                       sparse_block=100)),
    "strided_sq_ne_sk": ((1, 2, 2, 300, 170, 64), dict(sparse_pattern="strided",
                                                       sparse_block=40)),
    "strided_window": ((1, 2, 2, 400, 400, 64), dict(sparse_pattern="strided", sparse_block=30,
                                                     window=(100, -1))),
    "fixed_77": ((1, 2, 2, 77, 77, 64), dict(sparse_pattern="fixed", sparse_block=16,
                                             sparse_summary=4)),
    "fixed_1000": ((1, 2, 1, 1000, 1000, 128), dict(sparse_pattern="fixed", sparse_block=128,
                                                    sparse_summary=16)),
}
HEAVY_TC_PATTERNS = {"window_causal_1000", "strided_l128_1000", "strided_l100_gqa", "fixed_1000"}


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("name", [heavy(n) if n in HEAVY_TC_PATTERNS else n for n in TC_PATTERNS])
def test_gpu_tensor_core_patterns_forward_and_backward(name, dtype):
    """Forced onto the sm80 tensor-core kernels; "auto" picks them or (a window with kv_stride
    1 on Hopper) the Hopper forward, under the same rule."""
    shape, options = TC_PATTERNS[name]
    backend = "tensor_core"
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=61)
    assert uses_tensor_cores(q, k, v, options, backend="auto")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = samattn.attention(q, k, v, return_lse=True, backend=backend, **options)
    check_forward(out, lse, q, k, v, options, backend=backend)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(62)).to("cuda", dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, options)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape", [heavy((1, 2, 2, 1000, 1000, 64)),
                                   heavy((2, 4, 2, 300, 257, 128)), (1, 2, 2, 129, 129, 32)])
def test_gpu_strided_decomposition_matches_the_mask_paths(dtype, shape):
    """The built-in strided pattern (residue views + band, merged in one softmax) against the
    same pattern given as attn_mask (the tensor-core mask tile) and on SIMT: all three within
    their rules of the fp64 reference."""
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=63)
    options = dict(sparse_pattern="strided", sparse_block=48)
    built_in, lse = samattn.attention(q, k, v, return_lse=True, **options)
    check_forward(built_in, lse, q, k, v, options)
    mask = structure_of(options, shape[3], shape[4]).cuda()
    via_mask, mask_lse = samattn.attention(q, k, v, attn_mask=mask, return_lse=True)
    check_forward(via_mask, mask_lse, q, k, v, {}, attn_mask=mask)
    simt, simt_lse = samattn.attention(q, k, v, return_lse=True, backend="simt", **options)
    check_forward(simt, simt_lse, q, k, v, options, backend="simt")
    # The paths round P relative to different running maxima, so each is held to the reference
    # under its own rule rather than to the others; their lse agree to fp32 arithmetic.
    assert torch.allclose(lse, mask_lse, rtol=1e-5, atol=1e-5)
    assert torch.allclose(lse, simt_lse, rtol=1e-5, atol=1e-5)


@requires_cuda
@pytest.mark.parametrize("deterministic", [False, heavy(True)])
def test_gpu_strided_gradients_both_backward_paths(deterministic):
    """The backward of the strided pattern: residue views and band as separate parts (atomic
    dQ) or element-wise masking (the deterministic dQ kernel); both within the tensor-core
    rule, and bit-identical reruns when deterministic."""
    q, k, v = make_qkv(1, 4, 2, 500, 500, 64, dtype=torch.bfloat16, device="cuda", seed=65)
    options = dict(sparse_pattern="strided", sparse_block=64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = torch.randn(1, 4, 500, 64, generator=torch.Generator().manual_seed(66)).to(
        "cuda", torch.bfloat16)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        out = samattn.attention(q, k, v, **options)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        again = torch.autograd.grad(samattn.attention(q, k, v, **options), (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    check_gradients(grads, q, k, v, out, dout, options)
    if deterministic:
        for a, b in zip(grads, again):
            assert torch.equal(a, b)


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape", [(2, 4, 2, 77, 129, 64), heavy((1, 2, 2, 200, 200, 128)),
                                   (1, 2, 1, 130, 70, 40)])
@pytest.mark.parametrize("kind", ["bool", "float", "broadcast_row"])
def test_gpu_attn_mask_forward_and_backward(dtype, shape, kind):
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=32)
    B, H, _, Sq, Sk, _ = shape
    gen = torch.Generator().manual_seed(33)
    if kind == "bool":
        mask = (torch.rand(B, 1, Sq, Sk, generator=gen) > 0.3).cuda()
        mask[0, 0, 3] = False  # one fully masked row
    elif kind == "float":
        mask = torch.randn(B, H, Sq, Sk, generator=gen).cuda()
    else:
        mask = torch.randn(Sk, generator=gen).cuda().expand(B, H, Sq, Sk)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = samattn.attention(q, k, v, attn_mask=mask, return_lse=True)
    check_forward(out, lse, q, k, v, {}, attn_mask=mask)
    dout = torch.randn(out.shape, generator=gen).to(device="cuda", dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, {}, attn_mask=mask)


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("name", list(PATTERNS))
def test_gpu_pattern_gradients(name, dtype):
    (q, k, v), options, _ = gpu_pattern_inputs(name, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = samattn.attention(q, k, v, **options)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(34)).to(
        device="cuda", dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, options)


@requires_cuda
@pytest.mark.parametrize("dtype", [heavy(torch.float32), torch.float16])
def test_gpu_large_patterns_block_skipping(dtype):
    """Sequences long enough for whole key blocks to be skipped (window, strided, fixed)."""
    q, k, v = make_qkv(1, 2, 2, 700, 700, 64, dtype=dtype, device="cuda", seed=35)
    for options in (dict(window=(100, 0)), dict(window=(64, 64)),
                    dict(sparse_pattern="strided", sparse_block=128),
                    dict(sparse_pattern="fixed", sparse_block=128, sparse_summary=16)):
        out, lse = samattn.attention(q, k, v, return_lse=True, **options)
        check_forward(out, lse, q, k, v, options)


@requires_cuda
def test_gpu_cross_paths():
    q, k, v = make_qkv(2, 2, 2, 150, 150, 64, dtype=torch.float32, device="cuda", seed=36)
    causal = torch.ones(150, 150, dtype=torch.bool, device="cuda").tril()
    assert_close(samattn.attention(q, k, v, attn_mask=causal),
                 samattn.attention(q, k, v, causal=True, backend="simt").double(),
                 torch.float32)
    strided = dense_visibility(150, 150, kv_stride=3).cuda()
    assert_close(samattn.attention(q, k, v, attn_mask=strided),
                 samattn.attention(q, k, v, kv_stride=3, backend="simt").double(), torch.float32)
    pattern = dict(sparse_pattern="strided", sparse_block=16)
    assert_close(samattn.attention(q, k, v, attn_mask=definition_of(pattern, 150, 150).cuda()),
                 samattn.attention(q, k, v, **pattern).double(), torch.float32)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_gpu_tensor_core_cross_paths(dtype):
    """A mask equal to causal (mask tile) gives the unmasked causal kernel's output, and the
    tensor-core masked path agrees with SIMT within the rules."""
    q, k, v = make_qkv(2, 2, 2, 150, 150, 64, dtype=dtype, device="cuda", seed=64)
    causal = torch.ones(150, 150, dtype=torch.bool, device="cuda").tril()
    with_mask = samattn.attention(q, k, v, attn_mask=causal)
    assert samattn.selected_backend(q, k, v, attn_mask=causal) == "tensor_core"
    plain = samattn.attention(q, k, v, causal=True, backend="tensor_core")
    assert_close(with_mask, plain.double(), dtype)
    # The same window on both kernel families, each within its rule of the reference.
    window = dict(window=(30, 5))
    for backend in ("tensor_core", "simt"):
        out, lse = samattn.attention(q, k, v, return_lse=True, backend=backend, **window)
        check_forward(out, lse, q, k, v, window, backend=backend)


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_fully_masked_rows(dtype):
    q, k, v = make_qkv(1, 2, 2, 40, 50, 32, dtype=dtype, device="cuda", seed=37)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.ones(40, 50, dtype=torch.bool, device="cuda")
    mask[5] = False
    mask[33] = False
    out, lse = samattn.attention(q, k, v, attn_mask=mask, return_lse=True)
    assert torch.all(out[:, :, 5] == 0) and torch.all(out[:, :, 33] == 0)
    assert torch.all(torch.isneginf(lse[:, :, [5, 33]]))
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert torch.all(dq[:, :, [5, 33]] == 0)
    for g in (dq, dk, dv):
        assert not torch.isnan(g).any()


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("name", list(VARLEN_CASES))
def test_gpu_varlen(name, dtype):
    lengths_q, lengths_k, options = VARLEN_CASES[name]
    lengths_q = [n * 13 for n in lengths_q]
    lengths_k = [n * 13 for n in lengths_k]
    q, k, v, cu_q, cu_k = make_varlen(lengths_q, lengths_k, heads_q=4, heads_kv=2, dim=64,
                                      dim_v=64, dtype=dtype, device="cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = samattn.varlen_attention(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                        return_lse=True, **options)
    want, want_lse = per_sequence(q, k, v, cu_q.cpu(), cu_k.cpu(), **options)
    half = dtype in (torch.float16, torch.bfloat16)
    if half:
        # One launch on the tensor-core masked kernel, which rounds P.
        lowp = per_sequence_lowp(q, k, v, cu_q.cpu(), cu_k.cpu(), **options)
        assert_close_tensor_core(out, want, lowp, dtype)
    else:
        assert_close(out, want, dtype)
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(want_lse))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(38)).to(
        device="cuda", dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # The reference backward fed the kernel's forward output (D = rowsum(dO * out) on both
    # sides, as in FlashAttention's backward).
    cpu = [t.detach().double().cpu() for t in (dout, q, k, v, out)]
    window = options.get("window", (-1, -1))
    causal = options.get("causal", False)
    lower_right = causal == "lower_right"
    want_grads = samattn.ops.varlen_attention_backward(
        *cpu, want_lse, cu_q.cpu(), cu_k.cpu(), max(lengths_q), max(lengths_k), None,
        bool(causal) and not lower_right, window[0], window[1], lower_right)
    if not half:
        for got, ref in zip(grads, want_grads):
            assert_close(got, ref, dtype, scale_floor=1.0)
        return
    # The tensor-core backward's rule, sequence by sequence.
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs, ks, vs, os_, ds = (
            t[lo:hi].transpose(0, 1).unsqueeze(0).detach().cpu()
            for t, lo, hi in ((q, cq[b], cq[b + 1]), (k, ck[b], ck[b + 1]), (v, ck[b], ck[b + 1]),
                              (out, cq[b], cq[b + 1]), (dout, cq[b], cq[b + 1])))
        visible = structure_of(options, cq[b + 1] - cq[b], ck[b + 1] - ck[b])
        lowp, terms = lowp_backward_reference(ds, qs, ks, vs, os_, visible=visible)
        rows = ((cq[b], cq[b + 1]), (ck[b], ck[b + 1]), (ck[b], ck[b + 1]))
        for got, ref, low, term, (lo, hi) in zip(grads, want_grads, lowp, terms, rows):
            assert_close_backward_tensor_core(got[lo:hi], ref[lo:hi],
                                              low[0].transpose(0, 1), term[0].transpose(0, 1),
                                              dtype, scale_floor=1.0)


@requires_cuda
def test_gpu_cu_seqlens_on_wrong_device():
    q, k, v, cu_q, cu_k = make_varlen([3, 4], [3, 4], device="cuda")
    with pytest.raises(ValueError, match="cu_seqlens_q is on cpu"):
        samattn.varlen_attention(q, k, v, cu_q.cpu(), cu_k, 4, 4)


# ---- block-sparse ----------------------------------------------------------------------------

def test_block_sparse_tables_from_mask_and_back():
    gen = torch.Generator().manual_seed(40)
    mask = torch.rand(2, 1, 37, 45, generator=gen) > 0.97
    bs = samattn.block_sparse_from_mask(mask, block_q=8, block_k=16)
    assert bs.kv_num_blocks.shape == (2, 1, 5)
    block_map = bs.to_map(45)
    for b in range(2):
        for qb in range(5):
            for kb in range(3):
                want = bool(mask[b, 0, qb * 8:(qb + 1) * 8, kb * 16:(kb + 1) * 16].any())
                assert bool(block_map[b, 0, qb, kb]) == want
                listed = bs.kv_indices[b, 0, qb, :bs.kv_num_blocks[b, 0, qb]].tolist()
                assert (kb in listed) == want


def test_block_sparse_map_is_kept_until_the_tables_change():
    """to_map builds (and checks) the map once per seqlen_k; an in-place change of the tables or
    a new table tensor gives a new map with the change in it."""
    bs = samattn.block_sparse.from_map(torch.tensor([[[[1, 0, 1], [0, 1, 0]]]]), 4, 4)
    first = bs.to_map(12)
    assert bs.to_map(12) is first
    assert torch.equal(first[0, 0], torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.uint8))
    bs.kv_indices[0, 0, 1, 0] = 2  # query block 1 now lists key block 2 instead of 1
    changed = bs.to_map(12)
    assert changed is not first
    assert torch.equal(changed[0, 0], torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.uint8))
    shorter = bs.to_map(9)
    assert shorter is not changed and shorter.shape[-1] == 3
    bs.kv_num_blocks = torch.zeros_like(bs.kv_num_blocks)
    assert not bs.to_map(12).any()
    bs.kv_indices = torch.full_like(bs.kv_indices, 7)  # listed nothing: still in range
    with pytest.raises(ValueError, match="kv_indices must be in"):
        bs.kv_num_blocks = torch.ones_like(bs.kv_num_blocks)
        bs.to_map(12)


def block_visibility(bs, seqlen_q, seqlen_k):
    """(B|1, H|1, Sq, Sk) boolean expansion of the tables, from FlexAttention's definition."""
    b, h, qb = bs.kv_num_blocks.shape
    dense = torch.zeros(b, h, seqlen_q, seqlen_k, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for q in range(qb):
                for slot in range(int(bs.kv_num_blocks[bi, hi, q])):
                    kb = int(bs.kv_indices[bi, hi, q, slot])
                    dense[bi, hi, q * bs.block_q:(q + 1) * bs.block_q,
                          kb * bs.block_k:(kb + 1) * bs.block_k] = True
    return dense


@pytest.mark.parametrize("with_mask", [False, True])
def test_block_sparse_reference_matches_definition(with_mask):
    q, k, v = make_qkv(2, 2, 1, 40, 50, 4, dtype=torch.float64, seed=41)
    gen = torch.Generator().manual_seed(42)
    block_map = torch.rand(2, 1, 5, 4, generator=gen) > 0.5
    block_map[0, 0, 1] = False  # a query block with no key block: its rows give 0
    bs = samattn.block_sparse.from_map(block_map, 8, 13)
    visible = block_visibility(bs, 40, 50)
    mask = torch.rand(40, 50, generator=gen) > 0.3 if with_mask else None
    if with_mask:
        visible = visible & mask
    out, lse = samattn.attention(q, k, v, block_sparse=bs, attn_mask=mask, return_lse=True)
    want, want_lse = oracle(q, k, v, visible=visible)
    assert_close(out, want, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ours = torch.autograd.grad(samattn.attention(q, k, v, block_sparse=bs, attn_mask=mask).sum(),
                               (q, k, v))
    theirs = torch.autograd.grad(oracle(q, k, v, visible=visible)[0].sum(), (q, k, v))
    for got, ref in zip(ours, theirs):
        assert_close(got, ref, torch.float64, scale_floor=1.0)


def test_block_sparse_from_pattern_covers_the_pattern():
    options = dict(sparse_pattern="strided", sparse_block=6)
    bs = samattn.block_sparse_from_pattern(50, 50, block_q=8, block_k=8, **options)
    covered = block_visibility(bs, 50, 50)[0, 0]
    exact = definition_of(options, 50, 50)
    assert torch.all(covered | ~exact)  # every visible pair lies in a listed block
    q, k, v = make_qkv(1, 2, 2, 50, 50, 4, dtype=torch.float64, seed=43)
    # The pattern restricted to its own blocks is the pattern.
    assert_close(samattn.attention(q, k, v, block_sparse=bs, **options),
                 reference(q, k, v, **options)[0], torch.float64)


def test_block_sparse_validation():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 4, dtype=torch.float32, seed=44)
    bs = samattn.BlockSparse(torch.ones(1, 1, 2, dtype=torch.int32),
                             torch.tensor([[[[0], [5]]]], dtype=torch.int32), 8, 8)
    with pytest.raises(ValueError, match="kv_indices must be in"):
        samattn.attention(q, k, v, block_sparse=bs)
    bs = samattn.BlockSparse(torch.ones(1, 1, 2, dtype=torch.int64),
                             torch.zeros(1, 1, 2, 1, dtype=torch.int32), 8, 8)
    with pytest.raises(TypeError, match="must be int32"):
        samattn.attention(q, k, v, block_sparse=bs)
    bs = samattn.BlockSparse(torch.ones(1, 1, 3, dtype=torch.int32),
                             torch.zeros(1, 1, 3, 1, dtype=torch.int32), 8, 8)
    with pytest.raises(ValueError, match="block_map of shape"):
        samattn.attention(q, k, v, block_sparse=bs)


@requires_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_block_sparse(dtype):
    q, k, v = make_qkv(2, 4, 2, 300, 333, 64, dtype=dtype, device="cuda", seed=45)
    gen = torch.Generator().manual_seed(46)
    block_map = torch.rand(2, 1, 3, 3, generator=gen) > 0.4
    bs = samattn.block_sparse.from_map(block_map.cuda(), 128, 128)
    mask = (torch.rand(300, 333, generator=gen) > 0.2).cuda()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    for attn_mask in (mask, None):  # without a mask the map alone skips and keeps blocks
        out, lse = samattn.attention(q, k, v, block_sparse=bs, attn_mask=attn_mask, causal=True,
                                     return_lse=True)
        check_forward(out, lse, q, k, v, dict(causal=True), attn_mask=attn_mask, block_sparse=bs)
        dout = torch.randn(out.shape, generator=gen).to(device="cuda", dtype=dtype)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        check_gradients(grads, q, k, v, out, dout, dict(causal=True), attn_mask=attn_mask,
                        block_sparse=bs)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape,block,summary,seq_major", [
    ((1, 4, 2, 1000, 1000, 128), 128, 16, False),
    ((2, 2, 2, 700, 900, 64), 100, 20, True)])
def test_gpu_fixed_pattern_decomposition_on_hopper(dtype, shape, block, summary, seq_major):
    """On compute capability 9.0 the fixed pattern runs as its decomposition: the summary columns
    gathered into one staircase call on the Hopper forward, the own blocks on the masked kernel
    merging it. Against the reference and against the masked kernel forced on the same call
    (both within the tensor-core rule, lse equal to fp32 arithmetic); gradients through the
    masked backward from the decomposition's output and lse."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("no compute capability 9.0 GPU")
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=49,
                       layout="bshd" if seq_major else "bhsd")
    gen = torch.Generator().manual_seed(50)
    options = dict(sparse_pattern="fixed", sparse_block=block, sparse_summary=summary)
    assert samattn.selected_backend(q, k, v, **options) == "hopper"
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = samattn.attention(q, k, v, return_lse=True, **options)
    check_forward(out, lse, q, k, v, options)
    forced, forced_lse = samattn.attention(q, k, v, return_lse=True, backend="tensor_core",
                                           **options)
    check_forward(forced, forced_lse, q, k, v, options, backend="tensor_core")
    assert torch.allclose(lse, forced_lse, rtol=1e-5, atol=1e-5)
    dout = torch.randn(out.shape, generator=gen).to("cuda", dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, options)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("shape,causal,block_q", [((1, 4, 2, 1000, 1000, 128), True, 128),
                                                  ((2, 2, 2, 700, 900, 64), False, 64)])
def test_gpu_block_sparse_on_hopper(dtype, shape, causal, block_q):
    """On compute capability 9.0 the default dispatch runs a block map (no attn_mask) on the
    Hopper forward, which walks only the listed key blocks; against the reference, and against
    the tensor-core masked kernel forced on the same call, both within the tensor-core rule."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("no compute capability 9.0 GPU")
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=47)
    B, H, _, Sq, Sk, _ = shape
    gen = torch.Generator().manual_seed(48)
    block_map = torch.rand(B, H, -(-Sq // block_q), -(-Sk // 128), generator=gen) > 0.6
    block_map[0, 0, 1] = False  # a map row with nothing listed: zeros and lse = -inf
    bs = samattn.block_sparse.from_map(block_map.cuda(), block_q, 128)
    assert samattn.selected_backend(q, k, v, block_sparse=bs, causal=causal) == "hopper"
    out, lse = samattn.attention(q, k, v, block_sparse=bs, causal=causal, return_lse=True)
    check_forward(out, lse, q, k, v, dict(causal=causal), block_sparse=bs)
    assert torch.isneginf(lse[0, 0, block_q:2 * block_q]).all()
    forced, forced_lse = samattn.attention(q, k, v, block_sparse=bs, causal=causal,
                                           return_lse=True, backend="tensor_core")
    check_forward(forced, forced_lse, q, k, v, dict(causal=causal), block_sparse=bs,
                  backend="tensor_core")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(forced_lse))
    finite = torch.isfinite(lse)
    assert torch.allclose(lse[finite], forced_lse[finite], rtol=1e-5, atol=1e-5)


# ---- the window following bottom-right causal (FlashAttention's window_size) -----------------

def flash_window_visibility(seqlen_q, seqlen_k, left, right):
    """(Sq, Sk) boolean from FlashAttention-2's definition of causal=True with window_size."""
    i = torch.arange(seqlen_q).view(-1, 1)
    j = torch.arange(seqlen_k).view(1, -1)
    shift = seqlen_k - seqlen_q
    visible = j <= i + shift
    if left >= 0:
        visible = visible & (j >= i + shift - left)
    if right >= 0:
        visible = visible & (j <= i + shift + right)
    return visible


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(5, 17), (17, 5), (8, 8), (1, 30)])
@pytest.mark.parametrize("window", [(3, 0), (0, 0), (6, -1), (2, 1)])
def test_window_follows_causal_is_flash_attentions_window_size(seqlen_q, seqlen_k, window):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, 8, dtype=torch.float64, seed=21)
    out, lse = samattn.attention(q, k, v, causal="lower_right", window=window,
                                 window_follows_causal=True, return_lse=True)
    want, want_lse = oracle(q, k, v, visible=flash_window_visibility(seqlen_q, seqlen_k, *window))
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))


def test_window_follows_causal_per_entry_and_per_sequence():
    # With cache_seqlens the shift is each entry's; under varlen each sequence's.
    q, k, v = make_qkv(3, 4, 2, 4, 20, 8, dtype=torch.float64, seed=22)
    lengths = [20, 9, 3]
    out = samattn.attention(q, k, v, causal="lower_right", window=(5, 0), window_follows_causal=True,
                            cache_seqlens=torch.tensor(lengths, dtype=torch.int32))
    for b, length in enumerate(lengths):
        want, _ = oracle(q[b:b + 1], k[b:b + 1, :, :length], v[b:b + 1, :, :length],
                         visible=flash_window_visibility(4, length, 5, 0))
        assert torch.allclose(out[b:b + 1], want, rtol=1e-12, atol=1e-12)
    lengths_q, lengths_k = [4, 1, 6], [9, 7, 3]
    packed = make_varlen(lengths_q, lengths_k, dim=8, dim_v=8)
    qp, kp, vp, cu_q, cu_k = packed[:5]
    out = samattn.varlen_attention(qp, kp, vp, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                   causal="lower_right", window=(2, 1), window_follows_causal=True)
    for b in range(3):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        want, _ = oracle(qp[rows].transpose(0, 1).unsqueeze(0),
                         kp[keys].transpose(0, 1).unsqueeze(0),
                         vp[keys].transpose(0, 1).unsqueeze(0),
                         visible=flash_window_visibility(lengths_q[b], lengths_k[b], 2, 1))
        assert torch.allclose(out[rows].transpose(0, 1).unsqueeze(0), want, rtol=1e-12,
                              atol=1e-12)
    with pytest.raises(ValueError, match="needs causal='lower_right'"):
        samattn.attention(q, k, v, causal=True, window=(5, 0), window_follows_causal=True)


def test_window_follows_causal_gradients_match_torch_autograd():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 5, 11, 4, dtype=torch.float64,
                                                     seed=23))
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.attention(q, k, v, causal="lower_right", window=(3, 1),
                                          window_follows_causal=True), (q, k, v))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [0, 1])
def test_gpu_sliding_window_decoding_matches_reference(dtype, num_splits):
    # The decoding kernel with a left edge following bottom-right causal, per entry.
    q, k, v = make_qkv(3, 8, 2, 2, 1500, 128, dtype=dtype, device="cuda", layout="bshd", seed=24)
    lengths = [1500, 600, 40]
    n = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    options = dict(causal="lower_right", window=(256, 0), window_follows_causal=True,
                   num_splits=num_splits, cache_seqlens=n)
    assert "decoding kernel" in samattn.selected_backend(q, k, v, detail=True, **options)
    out, lse = samattn.attention(q, k, v, return_lse=True, **options)
    visible = torch.zeros(3, 1, 2, 1500, dtype=torch.bool)
    for b, length in enumerate(lengths):
        visible[b, 0, :, :length] = flash_window_visibility(2, length, 256, 0)
    check_forward(out, lse, q, k, v, {}, attn_mask=visible.cuda())
