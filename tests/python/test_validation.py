"""A bad input raises before anything runs, with an error naming the argument and what was
expected."""

import pytest
import torch

import samattn
from helpers import make_qkv, requires_cuda


def qkv(**kwargs):
    return make_qkv(2, 4, 2, 6, 7, 8, **kwargs)


CASES = [
    ("query rank", lambda q, k, v: (q[0], k, v), {}, ValueError, "query must be 4-D"),
    ("key rank", lambda q, k, v: (q, k[0], v), {}, ValueError, "key must be 4-D"),
    ("value rank", lambda q, k, v: (q, k, v[..., None]), {}, ValueError, "value must be 4-D"),
    ("dtype int", lambda q, k, v: (q.int(), k.int(), v.int()), {}, TypeError,
     "query dtype must be one of float64, float32, float16, bfloat16"),
    ("mixed dtype key", lambda q, k, v: (q, k.double(), v), {}, TypeError,
     r"key dtype \(Double\) must match query dtype \(Float\)"),
    ("mixed dtype value", lambda q, k, v: (q, k, v.half()), {}, TypeError,
     r"value dtype \(Half\) must match query dtype"),
    ("batch", lambda q, k, v: (q, k[:1], v[:1]), {}, ValueError, "batch sizes differ"),
    ("heads kv vs v", lambda q, k, v: (q, k, v[:, :1]), {}, ValueError,
     r"value heads \(1\) must equal key heads \(2\)"),
    ("gqa ratio", lambda q, k, v: (q[:, :3], k, v), {}, ValueError,
     r"query heads \(3\) must be a multiple of key/value heads \(2\)"),
    ("seqlen k vs v", lambda q, k, v: (q, k, v[:, :, :5]), {}, ValueError,
     r"value seq_len \(5\) must equal key seq_len \(7\)"),
    ("head_dim", lambda q, k, v: (q, k[..., :4], v), {}, ValueError,
     r"key head_dim \(4\) must equal query head_dim \(8\)"),
    ("head_dim too big", lambda q, k, v: (torch.randn(1, 1, 2, 300), torch.randn(1, 1, 2, 300),
                                          torch.randn(1, 1, 2, 8)), {}, ValueError,
     r"head_dim must be in \[1, 256\], got 300"),
    ("value head_dim too big", lambda q, k, v: (q, k, torch.randn(2, 2, 7, 257)), {}, ValueError,
     r"value head_dim must be in \[1, 256\], got 257"),
    ("last dim stride", lambda q, k, v: (q.transpose(2, 3).contiguous().transpose(2, 3), k, v),
     {}, ValueError, "query must be contiguous in its last dimension"),
    ("kv_stride", lambda q, k, v: (q, k, v), {"kv_stride": 0}, ValueError,
     "kv_stride must be >= 1, got 0"),
    ("scale nan", lambda q, k, v: (q, k, v), {"scale": float("nan")}, ValueError,
     "softmax_scale must be finite"),
    ("scale inf", lambda q, k, v: (q, k, v), {"scale": float("inf")}, ValueError,
     "softmax_scale must be finite"),
    ("backend", lambda q, k, v: (q, k, v), {"backend": "magic"}, ValueError,
     "backend must be one of 'auto', 'simt', 'tensor_core', 'hopper', got 'magic'"),
    ("none", lambda q, k, v: (q, None, v), {}, (TypeError, ValueError), "key|Tensor"),
]


@pytest.mark.parametrize("name,mutate,options,error,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_named_error(name, mutate, options, error, message):
    q, k, v = mutate(*qkv())
    with pytest.raises(error, match=message):
        samattn.attention(q, k, v, **options)


def test_output_of_wrong_shape_is_rejected_and_untouched():
    q, k, v = qkv()
    out = torch.full((2, 4, 6, 9), 7.0)
    with pytest.raises(ValueError, match=r"out must have shape \[2, 4, 6, 8\], got \[2, 4, 6, 9\]"):
        samattn.ops.attention_forward_into(q, k, v, out)
    assert torch.equal(out, torch.full_like(out, 7.0))
    out = torch.full((2, 4, 6, 8), 7.0, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"out dtype \(Double\) must match query dtype"):
        samattn.ops.attention_forward_into(q, k, v, out)
    assert torch.equal(out, torch.full_like(out, 7.0))
    out = torch.full((2, 4, 6, 8), 7.0)
    with pytest.raises(ValueError, match="kv_stride must be >= 1"):
        samattn.ops.attention_forward_into(q, k, v, out, kv_stride=0)
    assert torch.equal(out, torch.full_like(out, 7.0))


@requires_cuda
def test_mixed_devices_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"key is on cpu but query is on cuda:0"):
        samattn.attention(q.cuda(), k, v.cuda())
    with pytest.raises(ValueError, match=r"value is on cpu but query is on cuda:0"):
        samattn.attention(q.cuda(), k.cuda(), v)
    out = torch.empty(2, 4, 6, 8)
    with pytest.raises(ValueError, match=r"out is on cpu but query is on cuda:0"):
        samattn.ops.attention_forward_into(q.cuda(), k.cuda(), v.cuda(), out)


@requires_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_different_gpus_rejected():
    q, k, v = qkv(device="cuda:0")
    with pytest.raises(ValueError, match=r"key is on cuda:1 but query is on cuda:0"):
        samattn.attention(q, k.to("cuda:1"), v)
