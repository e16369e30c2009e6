"""Bottom-right aligned causal attention: samattn.attention(causal="lower_right") and torch's
CausalBias (torch.nn.attention.bias.causal_lower_right / causal_upper_left) through the SDPA
drop-in.

Query i sees key j when j <= i + Sk - Sq. The library runs it on existing options (a window, or
top-left causal on q's trailing rows when Sq > Sk), so every check here compares against the
dense boolean mask written from that definition, fed to the fp64 oracle of test_masks, never
against the mapping itself.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import samattn
from helpers import assert_close, make_qkv, requires_cuda
from test_masks import check_forward, check_gradients, dense_visibility, oracle

SEQLENS = [(1, 1), (1, 9), (4, 9), (9, 9), (9, 4), (9, 1), (5, 0)]


def lower_right_visibility(seqlen_q, seqlen_k, *, window=None, kv_stride=1):
    """(Sq, Sk) boolean from the definition: j <= i + Sk - Sq, and the window's (top-left)
    i - left <= j <= i + right, and j % kv_stride == 0."""
    rows = torch.arange(seqlen_q)[:, None]
    cols = torch.arange(seqlen_k)[None, :]
    visible = (cols <= rows + seqlen_k - seqlen_q) & (cols % kv_stride == 0)
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= cols >= rows - left
        if right >= 0:
            visible &= cols <= rows + right
    return visible


@pytest.mark.parametrize("seqlen_q,seqlen_k,left", [(1, 20, 4), (3, 20, 4), (4, 9, 5),
                                                   (4, 9, 7), (1, 9, 8), (6, 6, 2)])
def test_flash_attention_window_with_and_without_window_follows_causal(seqlen_q, seqlen_k, left):
    # FlashAttention-2's causal=True, window_size=(L, 0): i + Sk - Sq - L <= j <= i + Sk - Sq
    # (both edges on the bottom-right diagonal). With window_follows_causal it is one call; the
    # default window, anchored at j = i, gives it as window (L - (Sk - Sq), -1) when
    # Sk - Sq <= L, else window (0, -1) on the last L + Sq keys.
    q, k, v = make_qkv(1, 2, 1, seqlen_q, seqlen_k, 8, dtype=torch.float64, seed=13)
    rows = torch.arange(seqlen_q)[:, None]
    cols = torch.arange(seqlen_k)[None, :]
    diagonal = rows + seqlen_k - seqlen_q
    visible = (cols <= diagonal) & (cols >= diagonal - left)
    want, _ = oracle(q, k, v, visible=visible)
    offset = seqlen_k - seqlen_q
    if offset <= left:
        got = samattn.attention(q, k, v, causal="lower_right", window=(left - offset, -1))
    else:
        keep = left + seqlen_q
        got = samattn.attention(q, k[:, :, -keep:], v[:, :, -keep:], causal="lower_right",
                                window=(0, -1))
    assert_close(got, want, torch.float64)
    follows = samattn.attention(q, k, v, causal="lower_right", window=(left, 0),
                                window_follows_causal=True)
    assert_close(follows, want, torch.float64)


def grads_of(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
# (4, -1): with (Sq, Sk) = (9, 4) the left edge lands exactly at -1 after the 5 skipped rows.
@pytest.mark.parametrize("window", [None, (2, -1), (-1, 1), (6, 0), (1, 3), (4, -1), (5, -1)])
def test_lower_right_matches_definition(seqlen_q, seqlen_k, window):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, 8, 5, dtype=torch.float64, seed=1)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    visible = lower_right_visibility(seqlen_q, seqlen_k, window=window)
    out, lse = samattn.attention(q, k, v, causal="lower_right", window=window, return_lse=True)
    want, want_lse = oracle(q, k, v, visible=visible)
    assert_close(out, want, torch.float64)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
    if out.numel() == 0:
        return
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for got, ref in zip(grads_of(out, (q, k, v), dout), grads_of(want, (q, k, v), dout)):
        assert_close(got, ref, torch.float64, scale_floor=1.0)


def test_lower_right_with_kv_stride_mask_and_gqa():
    _, k, v = make_qkv(2, 6, 2, 7, 12, 4, dtype=torch.float64, seed=3)
    gen = torch.Generator().manual_seed(4)
    for rows in (7, 12, 21):
        # Sq > Sk too: q's trailing rows run, and a mask with Sq rows is cut the same way.
        qq = torch.randn(2, 6, rows, 4, dtype=torch.float64, generator=gen)
        mask = torch.rand(2, 1, rows, 12, generator=gen) > 0.3
        visible = lower_right_visibility(rows, 12, kv_stride=3) & mask
        got = samattn.attention(qq, k, v, causal="lower_right", kv_stride=3, attn_mask=mask)
        want, _ = oracle(qq, k, v, visible=visible)
        assert_close(got, want, torch.float64)


def test_named_upper_left_is_causal_true():
    q, k, v = make_qkv(1, 2, 2, 6, 9, 4, dtype=torch.float64, seed=5)
    assert torch.equal(samattn.attention(q, k, v, causal="upper_left"),
                       samattn.attention(q, k, v, causal=True))
    want, _ = oracle(q, k, v, visible=dense_visibility(6, 9, causal=True))
    assert_close(samattn.attention(q, k, v, causal="upper_left"), want, torch.float64)


def test_equal_lengths_lower_right_is_causal():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 4, dtype=torch.float64, seed=6)
    # The alignments agree: the call is the causal one (the causal kernels, not a window).
    assert torch.equal(samattn.attention(q, k, v, causal="lower_right"),
                       samattn.attention(q, k, v, causal=True))


def test_lower_right_rows_without_keys_are_zero_with_zero_gradient():
    q, k, v = make_qkv(1, 2, 1, 9, 4, 4, dtype=torch.float64, seed=7)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = samattn.attention(q, k, v, causal="lower_right", return_lse=True)
    assert torch.all(out[:, :, :5] == 0) and torch.all(torch.isneginf(lse[:, :, :5]))
    assert torch.isfinite(lse[:, :, 5:]).all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.all(dq[:, :, :5] == 0)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_lower_right_gradcheck():
    q, k, v = make_qkv(1, 2, 1, 5, 3, 3, dtype=torch.float64, seed=8)
    for seqlens in ((5, 3), (3, 5)):
        qq, kk = q[:, :, :seqlens[0]], torch.randn(1, 1, seqlens[1], 3, dtype=torch.float64)
        vv = torch.randn(1, 1, seqlens[1], 3, dtype=torch.float64)
        inputs = tuple(t.clone().requires_grad_() for t in (qq, kk, vv))
        assert torch.autograd.gradcheck(
            lambda q, k, v: samattn.attention(q, k, v, causal="lower_right", window=(1, -1)),
            inputs)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(3, 8), (8, 8), (8, 3)])
@pytest.mark.parametrize("variant", ["lower_right", "upper_left"])
def test_sdpa_causal_bias_matches_torch(seqlen_q, seqlen_k, variant):
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, 8, dtype=torch.float64, seed=9)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    make = causal_lower_right if variant == "lower_right" else causal_upper_left
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about lower-right rows without keys
        bias = make(seqlen_q, seqlen_k)
    got = samattn.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    visible = (lower_right_visibility(seqlen_q, seqlen_k) if variant == "lower_right"
               else dense_visibility(seqlen_q, seqlen_k, causal=True))
    want, _ = oracle(q, k, v, visible=visible)
    assert_close(got, want, torch.float64)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                              enable_gqa=True)
    seen = visible.any(dim=-1)  # torch may give NaN where a row sees no key
    assert_close(got[:, :, seen], theirs[:, :, seen], torch.float64)
    dout = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    for mine, ref in zip(grads_of(got, (q, k, v), dout), grads_of(want, (q, k, v), dout)):
        assert_close(mine, ref, torch.float64, scale_floor=1.0)


def test_invalid_causal_options_raise_before_running():
    q, k, v = make_qkv(1, 2, 2, 6, 4, 4, dtype=torch.float64, seed=11)
    with pytest.raises(ValueError, match="causal must be a bool, 'upper_left' or 'lower_right'"):
        samattn.attention(q, k, v, causal="bottom_right")
    with pytest.raises(ValueError, match="does not combine with sparse_pattern"):
        samattn.attention(q, k, v, causal="lower_right", sparse_pattern="strided",
                          sparse_block=2)
    blocks = samattn.block_sparse_from_mask(torch.ones(1, 1, 6, 4, dtype=torch.bool), 2, 2)
    with pytest.raises(ValueError, match="seqlen_q > seqlen_k does not combine with block_sparse"):
        samattn.attention(q, k, v, causal="lower_right", block_sparse=blocks)
    with pytest.raises(ValueError, match="CausalBias attn_mask cannot be combined with is_causal"):
        samattn.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(6, 4),
                                             is_causal=True)
    with pytest.raises(ValueError, match=r"CausalBias attn_mask is for .* \(5, 4\).* \(6, 4\)"):
        samattn.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(5, 4))
    with pytest.raises(ValueError, match="attn_mask's query dimension is 3, expected 6"):
        samattn.attention(q, k, v, causal="lower_right",
                          attn_mask=torch.ones(3, 4, dtype=torch.bool))


def test_torch_compile_traces_lower_right():
    q, k, v = make_qkv(1, 2, 2, 3, 7, 4, dtype=torch.float64, seed=12)
    compiled = torch.compile(lambda q, k, v: samattn.attention(q, k, v, causal="lower_right"),
                             fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), samattn.attention(q, k, v, causal="lower_right"))


# ---- GPU: the kernels the mapping reaches (Hopper or masked window, causal on trailing rows) ---

@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(2, 4, 2, 77, 300, 64), (1, 2, 2, 300, 129, 128),
                                   (2, 2, 1, 1, 1000, 64), (1, 4, 4, 256, 256, 96)])
def test_gpu_lower_right_forward_and_backward(dtype, shape):
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", seed=13)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    seqlen_q, seqlen_k = shape[3], shape[4]
    visible = lower_right_visibility(seqlen_q, seqlen_k).cuda()
    torch.cuda.synchronize()
    out, lse = samattn.attention(q, k, v, causal="lower_right", return_lse=True)
    check_forward(out, lse, q, k, v, {}, attn_mask=visible)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(14)).to(
        device="cuda", dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, {}, attn_mask=visible)


@requires_cuda
def test_gpu_sdpa_causal_bias_runs_without_a_mask_tensor():
    q, k, v = make_qkv(1, 8, 8, 128, 1024, 128, dtype=torch.bfloat16, device="cuda", seed=15)
    bias = causal_lower_right(128, 1024)
    got = samattn.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    want = samattn.attention(q, k, v, window=(-1, 1024 - 128))
    assert torch.equal(got, want)
    if torch.cuda.get_device_capability() == (9, 0):
        assert samattn.selected_backend(q, k, v, causal="lower_right") == "hopper"
