"""The CPU operator (samattn's fp64 reference) against an independent torch float64 oracle.
Runs everywhere, so CI exercises the whole Python layer without a GPU."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import samattn
from helpers import ALL_DTYPES, assert_close, make_qkv, torch_math_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_stride", [1, 3])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_reference_matches_torch_math(causal, kv_stride, layout):
    q, k, v = make_qkv(2, 4, 2, 17, 29, 12, 20, dtype=torch.float64, layout=layout, seed=1)
    out, lse = samattn.attention(q, k, v, causal=causal, kv_stride=kv_stride, return_lse=True)
    ref, ref_lse = torch_math_attention(q, k, v, causal=causal, kv_stride=kv_stride)
    assert_close(out, ref, torch.float64)
    assert_close(lse, ref_lse, torch.float64)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reference_every_dtype(dtype):
    q, k, v = make_qkv(1, 2, 2, 9, 11, 8, dtype=dtype, seed=2)
    out, lse = samattn.attention(q, k, v, causal=True, return_lse=True)
    assert out.dtype == dtype
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    ref, _ = torch_math_attention(q, k, v, causal=True)
    assert_close(out, ref, dtype)


def test_custom_scale():
    q, k, v = make_qkv(1, 1, 1, 5, 6, 4, dtype=torch.float64, seed=3)
    out = samattn.attention(q, k, v, scale=0.37)
    ref, _ = torch_math_attention(q, k, v, scale=0.37)
    assert_close(out, ref, torch.float64)


def test_no_keys_gives_zeros_and_negative_infinity():
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 0, 4, dtype=torch.float64)
    v = torch.randn(1, 2, 0, 5, dtype=torch.float64)
    out, lse = samattn.attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 3, 5)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


def test_empty_queries_and_batch():
    q, k, v = make_qkv(0, 2, 2, 4, 4, 8)
    assert samattn.attention(q, k, v).shape == (0, 2, 4, 8)
    q, k, v = make_qkv(2, 2, 2, 0, 4, 8)
    assert samattn.attention(q, k, v).shape == (2, 2, 0, 8)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 2), heads_kv=st.integers(1, 3), group=st.integers(1, 3),
       seqlen_q=st.integers(1, 20), seqlen_k=st.integers(0, 20), head_dim=st.integers(1, 24),
       head_dim_v=st.integers(1, 24), causal=st.booleans(), kv_stride=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_reference_fuzz(batch, heads_kv, group, seqlen_q, seqlen_k, head_dim, head_dim_v,
                        causal, kv_stride, seed):
    q, k, v = make_qkv(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k, head_dim,
                       head_dim_v, dtype=torch.float64, seed=seed)
    out = samattn.attention(q, k, v, causal=causal, kv_stride=kv_stride)
    if seqlen_k == 0:
        assert torch.equal(out, torch.zeros_like(out))
        return
    ref, _ = torch_math_attention(q, k, v, causal=causal, kv_stride=kv_stride)
    assert_close(out, ref, torch.float64)


def test_sdpa_dropin_matches_torch():
    q, k, v = make_qkv(2, 8, 2, 10, 14, 16, dtype=torch.float64, seed=4)
    for is_causal in (False, True):
        ours = samattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                  enable_gqa=True)
        assert_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("shape", [(6, 10, 8), (2, 3, 4, 10, 8)])
def test_sdpa_dropin_other_ranks(shape):
    q = torch.randn(*shape, dtype=torch.float64)
    k = torch.randn(*shape, dtype=torch.float64)
    v = torch.randn(*shape, dtype=torch.float64)
    ours = samattn.scaled_dot_product_attention(q, k, v, scale=0.2)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.2)
    assert ours.shape == theirs.shape
    assert_close(ours, theirs, torch.float64)


def test_sdpa_unsupported_arguments_raise():
    q, k, v = make_qkv(1, 2, 2, 4, 4, 8)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        samattn.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    q, k, v = make_qkv(1, 4, 2, 4, 4, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        samattn.scaled_dot_product_attention(q, k, v)


def test_seed_names():
    q, k, v = make_qkv(2, 2, 2, 12, 12, 8, dtype=torch.float64, seed=5)
    assert_close(samattn.strided_attention(q, k, v, 3),
                 torch_math_attention(q, k, v, kv_stride=3)[0], torch.float64)
    assert_close(samattn.fused_attention(q, k, v), torch_math_attention(q, k, v)[0],
                 torch.float64)
    x = torch.randn(9, 6, dtype=torch.float64)
    output = torch.full_like(x, float("nan"))
    returned = samattn.self_attention(x, output, 6)
    assert returned is output
    expected = torch.softmax(x @ x.T / math.sqrt(6), dim=-1) @ x
    assert_close(output, expected, torch.float64)


def test_self_attention_validates_output():
    x = torch.randn(9, 6)
    with pytest.raises(ValueError, match="output must have shape"):
        samattn.self_attention(x, torch.empty(9, 5), 6)
    with pytest.raises(ValueError, match=r"d \(8\) must equal"):
        samattn.self_attention(x, torch.empty(9, 6), 8)
    with pytest.raises(ValueError, match="output must be torch.float32"):
        samattn.self_attention(x, torch.empty(9, 6, dtype=torch.float64), 6)


def test_strided_attention_module():
    torch.manual_seed(0)
    module = samattn.nn.StridedAttention(32, 4, stride=2).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    out = module(x)
    assert out.shape == (2, 10, 32)
    heads = lambda t: t.view(2, 10, 4, 8).transpose(1, 2)  # noqa: E731
    attn, _ = torch_math_attention(heads(module.q_proj(x)), heads(module.k_proj(x)),
                                   heads(module.v_proj(x)), kv_stride=2)
    expected = module.out_proj(attn.transpose(1, 2).reshape(2, 10, 32))
    assert_close(out, expected, torch.float64)


def test_torch_compile_fullgraph_matches_eager():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 4, dtype=torch.float64, seed=6)

    def fn(q, k, v):
        return samattn.attention(q, k, v, causal=True).sin() + 1

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), fn(q, k, v))


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 5, 16, dtype=torch.float16)
        k = torch.empty(2, 2, 7, 16, dtype=torch.float16)
        v = torch.empty(2, 2, 7, 24, dtype=torch.float16)
        out, lse = samattn.attention(q, k, v, return_lse=True)
        assert out.shape == (2, 8, 5, 24) and out.dtype == torch.float16
        assert lse.shape == (2, 8, 5) and lse.dtype == torch.float32
