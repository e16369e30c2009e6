"""Split-key attention (flash-decoding): samattn.attention(..., num_splits=...).

The chunking and the merge's arithmetic are checked on the host by the C++ tests
(tests/cpp/test_key_split.cpp: the chunks run through the fp64 reference and merged equal the
whole call). Here: the Python plumbing on the CPU (where the reference ignores num_splits), and
on a GPU the kernels against the fp64 reference, forward, lse and the gradients of a split
forward.
"""

from __future__ import annotations

import pytest
import torch

import samattn
from helpers import make_qkv, requires_cuda
from test_masks import check_forward, check_gradients


def test_cpu_accepts_num_splits_and_computes_the_same():
    q, k, v = make_qkv(2, 4, 2, 1, 300, 16, dtype=torch.float64, seed=1)
    whole = samattn.attention(q, k, v)
    for splits in (0, 2, 7):
        assert torch.equal(samattn.attention(q, k, v, num_splits=splits), whole)


def test_negative_num_splits_is_named():
    q, k, v = make_qkv(1, 2, 2, 1, 30, 16, dtype=torch.float64, seed=2)
    with pytest.raises(ValueError, match="num_splits must be >= 0"):
        samattn.attention(q, k, v, num_splits=-1)


def test_one_query_lower_right_is_unmasked():
    # Decoding with causal="lower_right": the one query sees every key, so the call carries no
    # mask option and can split.
    q, k, v = make_qkv(1, 2, 2, 1, 40, 8, dtype=torch.float64, seed=3)
    assert torch.equal(samattn.attention(q, k, v, causal="lower_right"),
                       samattn.attention(q, k, v))


def test_torch_compile_traces_num_splits():
    q, k, v = make_qkv(1, 4, 2, 1, 200, 8, dtype=torch.float64, seed=9)
    compiled = torch.compile(lambda q, k, v: samattn.attention(q, k, v, num_splits=0),
                             fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k, v), samattn.attention(q, k, v))


# ---- GPU --------------------------------------------------------------------------------------

HALF = [torch.float16, torch.bfloat16]
# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim), layout, kv_stride
SHAPES = [
    ((2, 8, 2, 1, 3000, 128), "bhsd", 1),
    ((3, 4, 4, 1, 1000, 64), "bshd", 1),
    ((1, 4, 2, 5, 777, 96), "bshd", 1),
    ((2, 2, 1, 70, 2000, 128), "bhsd", 3),
    ((1, 2, 2, 1, 129, 32), "bhsd", 1),
    ((1, 2, 1, 3, 1500, 256), "bshd", 1),
    # The decoding kernel's row tiles: 64 rows (MQA, 2 queries), 48 rows, 8 rows of a
    # (B, S, H, D) cache with more batch entries.
    ((1, 32, 1, 2, 2000, 64), "bshd", 1),
    ((2, 16, 2, 6, 999, 128), "bhsd", 1),
    ((6, 32, 4, 1, 1500, 128), "bshd", 1),
]


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape,layout,kv_stride", SHAPES)
@pytest.mark.parametrize("num_splits", [0, 2, 7, 1000])
def test_gpu_split_forward_matches_reference(dtype, shape, layout, kv_stride, num_splits):
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", layout=layout, seed=4)
    options = {"kv_stride": kv_stride}
    out, lse = samattn.attention(q, k, v, return_lse=True, num_splits=num_splits, **options)
    assert not torch.isnan(out).any()
    check_forward(out, lse, q, k, v, options)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(2, 8, 2, 5, 3000, 128), (1, 4, 4, 9, 2001, 64)])
def test_gpu_split_lower_right_matches_reference(dtype, shape):
    # New queries against a cache: the full chunks need no mask, the last keeps the window.
    q, k, v = make_qkv(*shape, dtype=dtype, device="cuda", layout="bshd", seed=10)
    assert samattn.selected_backend(q, k, v, causal="lower_right", num_splits=0) == "tensor_core"
    out, lse = samattn.attention(q, k, v, causal="lower_right", return_lse=True, num_splits=0)
    check_forward(out, lse, q, k, v, {"window": (-1, shape[4] - shape[3])})


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["key_padding", "additive"])
def test_gpu_split_with_attn_mask_matches_reference(dtype, kind):
    # Each chunk reads its columns of the mask; a (B, 1, 1, S) padding mask launches per entry.
    q, k, v = make_qkv(3, 8, 2, 2, 2500, 128, dtype=dtype, device="cuda", seed=11)
    gen = torch.Generator().manual_seed(12)
    if kind == "key_padding":
        lengths = torch.tensor([2500, 1700, 333])
        mask = (torch.arange(2500)[None, :] < lengths[:, None])[:, None, None, :].cuda()
    else:
        mask = torch.randn(3, 8, 2, 2500, generator=gen).cuda()
        mask[0, 0, 1] = float("-inf")  # a row that sees no key
    assert samattn.selected_backend(q, k, v, attn_mask=mask, num_splits=0) == "tensor_core"
    out, lse = samattn.attention(q, k, v, attn_mask=mask, return_lse=True, num_splits=0)
    check_forward(out, lse, q, k, v, {}, attn_mask=mask)


@requires_cuda
def test_gpu_split_runs_on_the_tensor_cores_when_it_splits():
    q, k, v = make_qkv(1, 8, 2, 1, 4096, 128, dtype=torch.bfloat16, device="cuda", seed=5)
    assert samattn.selected_backend(q, k, v, num_splits=4) == "tensor_core"
    assert samattn.selected_backend(q, k, v, num_splits=4, detail=True) == \
        "tensor_core: decoding kernel, 4 key chunks"
    # kv_stride 2 does not take the decoding kernel: the tensor-core kernels run the chunks.
    assert samattn.selected_backend(q, k, v, kv_stride=2, num_splits=4, detail=True) == \
        "tensor_core: split, 4 key chunks"
    if torch.cuda.get_device_capability() == (9, 0):
        # Asked for the Hopper forward, the call does not split.
        assert samattn.selected_backend(q, k, v, num_splits=4, backend="hopper") == "hopper"
    # Causal and mask options other than a right edge do not split: the call runs as without
    # num_splits, same bits.
    for options in (dict(causal=True), dict(window=(100, -1))):
        assert torch.equal(samattn.attention(q, k, v, num_splits=4, **options),
                           samattn.attention(q, k, v, **options))
    # float32 does not split either.
    q32, k32, v32 = (t.float() for t in (q, k, v))
    assert torch.equal(samattn.attention(q32, k32, v32, num_splits=4),
                       samattn.attention(q32, k32, v32))


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_gpu_gradients_of_a_split_forward(dtype):
    # The backward reads the split forward's merged lse and output.
    q, k, v = make_qkv(2, 4, 2, 3, 1200, 64, dtype=dtype, device="cuda", seed=6)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = samattn.attention(q, k, v, num_splits=5)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(
        device="cuda", dtype=dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_gradients(grads, q, k, v, out, dout, {})


@requires_cuda
def test_gpu_split_under_cuda_graph_capture():
    q, k, v = make_qkv(1, 8, 8, 1, 5000, 128, dtype=torch.float16, device="cuda", seed=8)
    eager = samattn.attention(q, k, v, num_splits=0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        samattn.attention(q, k, v, num_splits=0)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = samattn.attention(q, k, v, num_splits=0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
