"""Per-entry key lengths: samattn.attention(..., cache_seqlens=...) (FlashAttention's
cache_seqlens: a KV cache allocated for Sk keys, filled to a different length per batch entry).

The definition, written here with torch ops: entry b sees only its first cache_seqlens[b] keys,
and causal="lower_right" aligns each entry to its own length. On the CPU (the fp64 reference) the
call must equal the same call with the equivalent boolean attn_mask, and a loop of one call per
entry on its keys, forward and gradients; on a GPU both routes (the decoding kernel, which reads
the lengths on the device, and one call per batch entry) against the fp64 reference, with NaN in
the cache rows past each length, which must never be read.
"""

from __future__ import annotations

import pytest
import torch

import samattn
from helpers import make_qkv, requires_cuda
from test_masks import check_forward, check_gradients, oracle


def lengths_mask(lengths, seqlen_q, seqlen_k, *, lower_right=False, causal=False):
    """(B, 1, Sq, Sk) boolean: what an entry's queries see, from the definition."""
    i = torch.arange(seqlen_q).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k).view(1, 1, 1, -1)
    length = lengths.cpu().long().view(-1, 1, 1, 1)
    visible = j < length
    if lower_right:
        visible = visible & (j <= i + length - seqlen_q)
    if causal:
        visible = visible & (j <= i)
    return visible


def per_entry(q, k, v, lengths, **options):
    """One call per batch entry on its own keys, concatenated: out and lse."""
    outs, lses = [], []
    for b, length in enumerate(lengths.tolist()):
        out, lse = samattn.attention(q[b:b + 1], k[b:b + 1, :, :length], v[b:b + 1, :, :length],
                                     return_lse=True, **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


CASES = {
    # (B, Hq, Hkv, Sq, Sk, D), lengths, causal
    "one_query_gqa": ((4, 4, 2, 1, 30, 8), [30, 7, 0, 1], False),
    "drafts_lower_right": ((3, 2, 2, 5, 30, 8), [30, 12, 3], "lower_right"),
    "top_left_causal": ((3, 2, 1, 9, 20, 4), [20, 5, 9], True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_equals_the_definition_the_mask_and_per_entry_calls(name):
    shape, lengths, causal = CASES[name]
    q, k, v = make_qkv(*shape, dtype=torch.float64, seed=11)
    lengths = torch.tensor(lengths, dtype=torch.int32)
    out, lse = samattn.attention(q, k, v, cache_seqlens=lengths, causal=causal, return_lse=True)
    visible = lengths_mask(lengths, shape[3], shape[4], lower_right=causal == "lower_right",
                           causal=causal is True)
    want, want_lse = oracle(q, k, v, visible=visible)
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
    masked, masked_lse = samattn.attention(q, k, v, attn_mask=visible, causal=causal is True,
                                           return_lse=True)
    assert torch.equal(out, masked) and torch.equal(lse, masked_lse)
    looped, looped_lse = per_entry(q, k, v, lengths, causal=causal)
    assert torch.allclose(out, looped, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(looped_lse))


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_gradients_equal_the_masks_and_rows_past_the_lengths_get_none(name):
    shape, lengths, causal = CASES[name]
    lengths = torch.tensor(lengths, dtype=torch.int32)
    visible = lengths_mask(lengths, shape[3], shape[4], lower_right=causal == "lower_right",
                           causal=causal is True)
    grads = []
    for options in ({"cache_seqlens": lengths, "causal": causal},
                    {"attn_mask": visible, "causal": causal is True}):
        q, k, v = (t.requires_grad_() for t in make_qkv(*shape, dtype=torch.float64, seed=12))
        out = samattn.attention(q, k, v, **options)
        out.backward(torch.randn(out.shape, dtype=torch.float64,
                                 generator=torch.Generator().manual_seed(3)))
        grads.append((q.grad, k.grad, v.grad))
    for got, want in zip(*grads):
        assert torch.equal(got, want)
    _, dk, dv = grads[0]
    for b, length in enumerate(lengths.tolist()):
        assert not dk[b, :, length:].any() and not dv[b, :, length:].any()


def test_cpu_gradcheck_lower_right():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 2, 1, 3, 6, 3, dtype=torch.float64,
                                                     seed=13))
    lengths = torch.tensor([6, 2], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.attention(q, k, v, cache_seqlens=lengths, causal="lower_right"),
        (q, k, v))


def test_errors_name_the_argument():
    q, k, v = make_qkv(3, 2, 2, 1, 10, 4, dtype=torch.float64, seed=14)
    with pytest.raises(TypeError, match="cache_seqlens must be int32"):
        samattn.attention(q, k, v, cache_seqlens=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"one entry per batch entry \(3\)"):
        samattn.attention(q, k, v, cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] is 11, expected 0 <= value"):
        samattn.attention(q, k, v, cache_seqlens=torch.tensor([1, 11, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens must be 1-D"):
        samattn.attention(q, k, v, cache_seqlens=torch.ones(3, 1, dtype=torch.int32))


def test_torch_compile_traces_cache_seqlens():
    q, k, v = make_qkv(2, 4, 2, 1, 20, 8, dtype=torch.float64, seed=15)
    lengths = torch.tensor([20, 9], dtype=torch.int32)
    compiled = torch.compile(
        lambda q, k, v, n: samattn.attention(q, k, v, cache_seqlens=n, causal="lower_right"),
        fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v, lengths),
                       samattn.attention(q, k, v, cache_seqlens=lengths, causal="lower_right"))


# ---- GPU --------------------------------------------------------------------------------------

HALF = [torch.float16, torch.bfloat16]
GPU_CASES = {
    # (B, Hq, Hkv, Sq, Sk, D), layout, causal, num_splits: the decoding kernel (<= 64 rows per kv
    # head; one chunk at num_splits 1) or one call per entry (top-left causal, rows past it).
    "decode_split_gqa": ((4, 8, 2, 1, 3000, 128), "bshd", False, 0),
    "decode_drafts_lower_right": ((4, 8, 2, 5, 1000, 64), "bshd", "lower_right", 4),
    "decode_d256": ((4, 8, 1, 1, 2000, 256), "bhsd", False, 0),
    "decode_unsplit_default": ((4, 8, 2, 1, 700, 128), "bshd", False, 1),
    "per_entry_lower_right": ((4, 4, 2, 40, 700, 128), "bhsd", "lower_right", 1),
    "per_entry_causal_d64": ((4, 4, 4, 33, 300, 64), "bshd", True, 1),
    "per_entry_rows_past_the_kernel": ((4, 16, 1, 8, 900, 64), "bshd", "lower_right", 0),
}


def gpu_inputs(shape, layout, dtype):
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", layout=layout, seed=16)
    seqlen_k = shape[4]
    lengths = torch.tensor([seqlen_k, seqlen_k // 3 + 1, 0, 5][:shape[0]], dtype=torch.int32,
                           device="cuda")
    # The cache rows past each length are never read: NaN there must not reach the output.
    for b, length in enumerate(lengths.tolist()):
        k[b, :, length:] = float("nan")
        v[b, :, length:] = float("nan")
    return q, k, v, lengths


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_forward_matches_reference(name, dtype):
    shape, layout, causal, num_splits = GPU_CASES[name]
    q, k, v, lengths = gpu_inputs(shape, layout, dtype)
    detail = samattn.selected_backend(q, k, v, causal=causal, num_splits=num_splits, detail=True,
                                      cache_seqlens=lengths)
    assert ("decoding kernel" in detail) == name.startswith("decode"), detail
    assert ("one call per batch entry" in detail) == name.startswith("per_entry"), detail
    out, lse = samattn.attention(q, k, v, causal=causal, num_splits=num_splits,
                                 cache_seqlens=lengths, return_lse=True)
    assert not torch.isnan(out).any()
    visible = lengths_mask(lengths, shape[3], shape[4], lower_right=causal == "lower_right",
                           causal=causal is True)
    # The reference never reads hidden keys; the low-precision model multiplies them by 0.
    k0, v0 = k.nan_to_num(0.0), v.nan_to_num(0.0)
    check_forward(out, lse, q, k0, v0, {}, attn_mask=visible.cuda())


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["per_entry_lower_right", "per_entry_causal_d64"])
def test_gpu_gradients_match_reference(name, dtype):
    shape, layout, causal, num_splits = GPU_CASES[name]
    q, k, v, lengths = gpu_inputs(shape, layout, dtype)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = samattn.attention(q, k, v, causal=causal, num_splits=num_splits, cache_seqlens=lengths)
    dout = torch.randn_like(out)
    out.backward(dout)
    visible = lengths_mask(lengths, shape[3], shape[4], lower_right=causal == "lower_right",
                           causal=causal is True)
    check_gradients((q.grad, k.grad, v.grad), q, k, v, out.detach(), dout, {},
                    attn_mask=visible.cuda())
    for b, length in enumerate(lengths.tolist()):
        assert not k.grad[b, :, length:].any() and not v.grad[b, :, length:].any()


def test_cpu_left_padded_queries_of_different_counts_align_to_each_entry():
    # The README's recipe: entry b brings counts[b] new tokens, q left-padded to the longest;
    # under causal="lower_right" its last counts[b] rows equal a call on those queries alone.
    counts, lengths = [1, 4, 0], [9, 12, 5]
    q, k, v = make_qkv(3, 4, 2, max(counts), 12, 8, dtype=torch.float64, seed=17)
    out = samattn.attention(q, k, v, causal="lower_right",
                            cache_seqlens=torch.tensor(lengths, dtype=torch.int32))
    for b, (count, length) in enumerate(zip(counts, lengths)):
        if count == 0:
            continue
        alone = samattn.attention(q[b:b + 1, :, -count:], k[b:b + 1, :, :length],
                                  v[b:b + 1, :, :length], causal="lower_right")
        assert torch.allclose(out[b:b + 1, :, -count:], alone, rtol=1e-12, atol=1e-12)
