"""Gradients: autograd through samattn's ops. On the CPU (everywhere) the fp64 reference backward
is checked with gradcheck, against torch autograd of an independent float64 formula, with
opcheck, under torch.compile and by training seed 000's model; with a GPU the SIMT, tensor-core
and (on compute capability 9.0) Hopper backwards are checked against the fp64 reference, for
bit-identical reruns, with gradcheck in float64 and under CUDA-graph capture."""

import os
import sys
import zlib

import math

import pytest
import torch

import samattn
from helpers import (ALL_DTYPES, assert_close, assert_close_backward_tensor_core,
                     lowp_backward_reference, make_qkv, requires_cuda, torch_math_attention)

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "strided_attention")

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v) and options.
CPU_SCENARIOS = {
    "dense": dict(shape=(2, 2, 2, 5, 6, 3, 3)),
    "causal": dict(shape=(1, 2, 2, 6, 6, 4, 4), causal=True),
    "kv_stride": dict(shape=(1, 2, 2, 5, 9, 3, 3), kv_stride=3),
    "kv_stride_causal": dict(shape=(1, 1, 1, 7, 7, 3, 2), kv_stride=2, causal=True),
    "gqa": dict(shape=(1, 4, 2, 4, 5, 3, 3)),
    "mqa_causal": dict(shape=(1, 3, 1, 5, 5, 2, 3), causal=True),
    "sq_gt_sk_causal": dict(shape=(1, 2, 2, 7, 3, 3, 3), causal=True),
    "sq_lt_sk": dict(shape=(1, 2, 1, 3, 8, 3, 4)),
    "scale": dict(shape=(1, 2, 2, 4, 5, 3, 3), scale=0.7),
    "bshd_layout": dict(shape=(2, 2, 2, 4, 5, 3, 3), layout="bshd"),
}


def make_inputs(name, dtype=torch.float64, device="cpu", seed=None):
    sc = dict(CPU_SCENARIOS[name])
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v = sc.pop("shape")
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v,
                       dtype=dtype, device=device, layout=sc.pop("layout", "bhsd"),
                       seed=zlib.crc32(name.encode()) if seed is None else seed)
    return [t.requires_grad_() for t in (q, k, v)], sc


@pytest.mark.parametrize("name", list(CPU_SCENARIOS))
def test_gradcheck_cpu(name):
    (q, k, v), options = make_inputs(name)
    assert torch.autograd.gradcheck(lambda q, k, v: samattn.attention(q, k, v, **options),
                                    (q, k, v))


@pytest.mark.parametrize("name", list(CPU_SCENARIOS))
def test_reference_gradients_match_torch_autograd(name):
    (q, k, v), options = make_inputs(name)
    dout = torch.randn(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    ours = torch.autograd.grad(samattn.attention(q, k, v, **options), (q, k, v), dout)
    theirs = torch.autograd.grad(torch_math_attention(q, k, v, **options)[0], (q, k, v), dout)
    for got, expected in zip(ours, theirs):
        assert got.shape == expected.shape and got.is_contiguous()
        assert_close(got, expected, torch.float64)


def test_empty_problems_give_zero_gradients():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 4, 0, 3, dtype=torch.float64))
    dq, = torch.autograd.grad(samattn.attention(q, k, v).sum(), (q,))
    assert torch.equal(dq, torch.zeros_like(dq))
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 0, 5, 3, dtype=torch.float64))
    dk, dv = torch.autograd.grad(samattn.attention(q, k, v).sum(), (k, v))
    assert torch.equal(dk, torch.zeros_like(dk)) and torch.equal(dv, torch.zeros_like(dv))


def test_lse_is_returned_but_not_differentiable():
    (q, k, v), _ = make_inputs("dense")
    out, lse = samattn.attention(q, k, v, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def test_direct_op_without_lse_is_still_differentiable():
    (q, k, v), _ = make_inputs("causal")
    out, lse = samattn.ops.attention_forward(q, k, v, None, True, 1, False, "auto")
    assert lse.shape == (0,)
    ours = torch.autograd.grad(out.sum(), (q, k, v))
    theirs = torch.autograd.grad(samattn.attention(q, k, v, causal=True).sum(), (q, k, v))
    for got, expected in zip(ours, theirs):
        assert torch.equal(got, expected)


def test_double_backward_raises():
    (q, k, v), _ = make_inputs("dense")
    dq, = torch.autograd.grad(samattn.attention(q, k, v).square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dq.sum(), (q, k, v))


def test_self_attention_is_not_differentiable():
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        samattn.self_attention(x, torch.empty(5, 4, dtype=torch.float64), 4)
    view = x.view(1, 1, 5, 4)
    with pytest.raises(RuntimeError, match="not differentiable"):
        samattn.ops.attention_forward_into(view, view, view,
                                           torch.empty(1, 1, 5, 4, dtype=torch.float64))
    with torch.no_grad():
        output = torch.empty(5, 4, dtype=torch.float64)
        version = output._version
        samattn.self_attention(x, output, 4)
        assert output._version > version


def backward_args(name="gqa", dtype=torch.float64):
    (q, k, v), options = make_inputs(name, dtype)
    out, lse = samattn.attention(q, k, v, return_lse=True, **options)
    dout = torch.randn_like(out)
    return [dout, q.detach(), k.detach(), v.detach(), out.detach(), lse,
            options.get("scale"), options.get("causal", False), options.get("kv_stride", 1),
            False]


@pytest.mark.parametrize("change, error, message", [
    (lambda a: a.__setitem__(0, a[0][:, :, :-1]), ValueError, r"dout must have shape"),
    (lambda a: a.__setitem__(0, a[0].float()), TypeError, r"dout dtype"),
    (lambda a: a.__setitem__(4, a[4][..., :-1]), ValueError, r"out must have shape"),
    (lambda a: a.__setitem__(5, a[5].float()), TypeError, r"lse dtype must be Double"),
    (lambda a: a.__setitem__(5, a[5][:, :, :-1]), ValueError, r"lse must have shape"),
    (lambda a: a.__setitem__(5, torch.empty(0, dtype=torch.float64)), ValueError,
     r"return_lse=True"),
    (lambda a: a.__setitem__(8, 0), ValueError, r"kv_stride must be >= 1"),
])
def test_backward_op_rejects_bad_arguments(change, error, message):
    args = backward_args()
    change(args)
    with pytest.raises(error, match=message):
        samattn.ops.attention_backward(*args)


def test_opcheck_forward_and_backward():
    for name in ("gqa", "kv_stride_causal"):
        (q, k, v), options = make_inputs(name)
        for return_lse in (True, False):
            torch.library.opcheck(samattn.ops.attention_forward,
                                  (q, k, v, options.get("scale"), options.get("causal", False),
                                   options.get("kv_stride", 1), return_lse, "auto"))
        torch.library.opcheck(samattn.ops.attention_backward, backward_args(name))


class TinyAttentionModel(torch.nn.Module):
    """A causal GQA attention block: projections around one samattn call on (B, S, H, D) views."""

    def __init__(self, dim=16, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim, dtype=torch.float64)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim, dtype=torch.float64)
        self.out = torch.nn.Linear(dim, dim, dtype=torch.float64)

    def forward(self, x):
        batch, seq, dim = x.shape
        q = self.q(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(batch, seq, 2, self.kv_heads, self.head_dim).unbind(2)
        attn = samattn.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return self.out(attn.transpose(1, 2).reshape(batch, seq, dim))


def test_torch_compile_forward_and_backward_match_eager():
    torch.manual_seed(0)
    model = TinyAttentionModel()
    x = torch.randn(2, 9, 16, dtype=torch.float64)

    def loss_and_grads(fn):
        model.zero_grad()
        loss = fn(x).square().sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager_loss, eager_grads = loss_and_grads(model)
    compiled_loss, compiled_grads = loss_and_grads(torch.compile(model, fullgraph=True))
    assert_close(compiled_loss, eager_loss, torch.float64)
    for got, expected in zip(compiled_grads, eager_grads):
        assert_close(got, expected, torch.float64)


def test_entry_points_are_differentiable():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 2, 6, 6, 4, dtype=torch.float64))
    sdpa = samattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True)
    for got, want in zip(torch.autograd.grad(sdpa.sum(), (q, k, v)),
                         torch.autograd.grad(expected.sum(), (q, k, v))):
        assert_close(got, want, torch.float64)
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 7, 7, 4, dtype=torch.float64))
    for out, expected in ((samattn.strided_attention(q, k, v, 3),
                           torch_math_attention(q, k, v, kv_stride=3)[0]),
                          (samattn.fused_attention(q, k, v), torch_math_attention(q, k, v)[0])):
        for got, want in zip(torch.autograd.grad(out.sum(), (q, k, v)),
                             torch.autograd.grad(expected.sum(), (q, k, v))):
            assert_close(got, want, torch.float64)


def train(model, x, target, steps, lr=0.05):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_seed_000_model_trains_like_the_naive_model():
    sys.path.insert(0, EXAMPLE_DIR)
    try:
        from attention import CustomStridedAttention, NaiveStridedAttention
        from model import SimpleModel
    finally:
        sys.path.remove(EXAMPLE_DIR)
    torch.manual_seed(0)
    naive = SimpleModel(32, 4, 3, NaiveStridedAttention).double()
    custom = SimpleModel(32, 4, 3, CustomStridedAttention).double()
    custom.load_state_dict(naive.state_dict())
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    target = torch.randn(2, 20, 32, dtype=torch.float64)
    naive_losses = train(naive, x, target, steps=5)
    custom_losses = train(custom, x, target, steps=5)
    assert custom_losses[-1] < custom_losses[0]
    # The naive softmax adds 1e-6 to its denominator (the assignment's), so the two models
    # differ by about 1e-6 relative, and so do their losses.
    for ours, theirs in zip(custom_losses, naive_losses):
        assert ours == pytest.approx(theirs, rel=1e-5)


def test_strided_attention_module_trains():
    torch.manual_seed(0)
    module = samattn.nn.StridedAttention(32, 4, stride=2, dtype=torch.float64)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    losses = train(module, x, torch.randn_like(x), steps=5, lr=0.1)
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------------------------------------
# GPU: the SIMT backward.

GPU_SCENARIOS = {
    "dense": dict(shape=(2, 4, 4, 77, 129, 64, 64)),
    "causal": dict(shape=(2, 4, 4, 129, 129, 64, 64), causal=True),
    "causal_sq_gt_sk": dict(shape=(1, 2, 2, 130, 40, 64, 64), causal=True),
    "causal_sq_lt_sk": dict(shape=(1, 2, 2, 40, 130, 64, 64), causal=True),
    "strided": dict(shape=(2, 4, 4, 100, 256, 64, 64), kv_stride=4),
    "strided_causal": dict(shape=(1, 4, 4, 129, 129, 32, 32), kv_stride=3, causal=True),
    "gqa_8to1": dict(shape=(2, 8, 1, 64, 80, 128, 128)),
    "bshd_layout": dict(shape=(2, 4, 2, 65, 70, 64, 64), layout="bshd"),
    "s1": dict(shape=(3, 2, 2, 1, 1, 64, 64)),
    "s1000": dict(shape=(1, 2, 2, 1000, 1000, 64, 64), causal=True),
    "head_dim_8": dict(shape=(1, 2, 2, 33, 33, 8, 8)),
    "head_dim_72": dict(shape=(1, 2, 2, 33, 47, 72, 72)),
    "head_dim_96": dict(shape=(1, 2, 2, 33, 47, 96, 96)),
    "head_dim_256": dict(shape=(1, 2, 2, 70, 90, 256, 256), causal=True),
    "value_dim_differs": dict(shape=(1, 2, 2, 20, 30, 32, 48)),
    "scale": dict(shape=(1, 2, 2, 50, 60, 64, 64), scale=0.05),
}


def gpu_problem(name, dtype):
    sc = dict(GPU_SCENARIOS[name])
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v = sc.pop("shape")
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v,
                       dtype=dtype, device="cuda", layout=sc.pop("layout", "bhsd"),
                       seed=zlib.crc32(name.encode()))
    return q, k, v, sc


def poison_cuda_cache(*like):
    """Allocates and frees NaN tensors shaped like the gradients the op allocates next, so the
    caching allocator most likely hands it those blocks and an unwritten element fails."""
    [torch.full(t.shape, float("nan"), dtype=t.dtype, device="cuda") for t in like]


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_gradients_match_reference(name, dtype):
    q, k, v, options = gpu_problem(name, dtype)
    out, lse = samattn.attention(q, k, v, return_lse=True, **options)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    args = (options.get("scale"), options.get("causal", False), options.get("kv_stride", 1),
            False)
    poison_cuda_cache(q, k, v)
    # backend="simt": fp16/bf16 would otherwise take the tensor-core backward (tested below).
    grads = samattn.ops.attention_backward(dout, q, k, v, out, lse, *args, "simt")
    # The oracle: the fp64 reference backward on exact float64 copies of the same inputs,
    # including the forward's out (D = dout . out uses it on both sides, as FlashAttention's
    # backward does). The SIMT backward accumulates in fp32 (fp64 for fp64) and rounds only its
    # outputs, so the forward's tolerance rule for each dtype applies unchanged.
    cpu = [t.detach().double().cpu() for t in (dout, q, k, v, out)]
    expected = samattn.ops.attention_backward(*cpu, lse.double().cpu(), *args)
    # Error scale of each gradient: the terms it sums (see helpers.assert_close), since dq and dk
    # vanish when a row sees a single key.
    softmax_scale = abs(options.get("scale") or 1.0 / math.sqrt(q.shape[-1]))
    dp = dout.abs().max().item() * v.abs().max().item()
    floors = (softmax_scale * dp * k.abs().max().item(), softmax_scale * dp * q.abs().max().item(),
              dout.abs().max().item())
    for got, ref, like, floor in zip(grads, expected, (q, k, v), floors):
        assert got.shape == like.shape and got.dtype == dtype
        assert_close(got, ref, dtype, scale_floor=floor)


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_gpu_backward_reruns_are_bit_identical(dtype):
    q, k, v, options = gpu_problem("gqa_8to1", dtype)
    out, lse = samattn.attention(q, k, v, return_lse=True, causal=True)
    dout = torch.randn_like(out)
    # deterministic=True on both runs: the tensor-core backward (fp16/bf16) adds dq with atomics
    # otherwise; SIMT (float32/float64) is deterministic either way.
    first = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, True, 1, True)
    second = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, True, 1, True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# The tensor-core backward (fp16/bf16, head dims 32/64/96/128/192/256, sm80+): every GPU scenario it
# supports, through autograd (samattn.attention(..., backend="tensor_core") then .backward),
# with atomic dq and under torch.use_deterministic_algorithms, against the fp64 reference.
TENSOR_CORE_SCENARIOS = [name for name, sc in GPU_SCENARIOS.items()
                         if sc["shape"][5] == sc["shape"][6]
                         and sc["shape"][5] in (32, 64, 96, 128, 192, 256)]
TENSOR_CORE_SCENARIOS_EXTRA = {
    "causal_128_gqa_4to1": dict(shape=(1, 8, 2, 200, 200, 128, 128), causal=True),
    "strided4_causal_128": dict(shape=(1, 2, 2, 150, 150, 128, 128), kv_stride=4, causal=True),
    "mqa_96": dict(shape=(1, 6, 1, 77, 129, 96, 96)),
    "s77_32": dict(shape=(2, 2, 2, 77, 77, 32, 32), causal=True),
    "gqa_2to1_causal_192": dict(shape=(1, 4, 2, 130, 150, 192, 192), causal=True),
    "strided2_256": dict(shape=(1, 2, 2, 100, 200, 256, 256), kv_stride=2),
    "bshd_causal_256": dict(shape=(2, 4, 2, 65, 70, 256, 256), causal=True, layout="bshd"),
}
GPU_SCENARIOS.update(TENSOR_CORE_SCENARIOS_EXTRA)
TENSOR_CORE_SCENARIOS += list(TENSOR_CORE_SCENARIOS_EXTRA)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("options", [dict(causal=True), dict(kv_stride=3, scale=0.3)],
                         ids=["causal", "strided"])
def test_tensor_core_backward_rule(dtype, options):
    """The rule of the tensor-core test, on the CPU: the same-dtype reference (the error rounding
    P and dS costs) is within it against float64 autograd; swapping two keys' rows is not."""
    q, k, v = make_qkv(1, 4, 2, 70, 75, 64, dtype=dtype, seed=9)
    dout = torch.randn(1, 4, 70, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    out, _ = torch_math_attention(*exact, **options)
    refs = torch.autograd.grad(out, exact, dout.double())
    refs = [r.nan_to_num(0.0) for r in refs]  # strided: skipped keys have zero gradients
    lowp, terms = lowp_backward_reference(dout, q, k, v, out.detach(), **options)
    for ref, low, term in zip(refs, lowp, terms):
        assert (low - ref).abs().max() > 0  # the rounding is visible
        assert_close_backward_tensor_core(low, ref, low, term, dtype)
    for index in (0, 2):  # dq, dv with rows 5 and 6 swapped
        swapped = lowp[index].clone()
        swapped[0, 0, [5, 6]] = lowp[index][0, 0, [6, 5]]
        with pytest.raises(AssertionError):
            assert_close_backward_tensor_core(swapped, refs[index], lowp[index], terms[index],
                                              dtype)
    if options.get("causal"):  # a mask off by one: keys 16-31 lose their diagonal query's term
        scores = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / 8.0
        hidden = torch.arange(75)[None, :] > torch.arange(70)[:, None]
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        dv = lowp[2].clone()
        for j in range(16, 32):
            for h in (0, 1):  # the query heads of key head 0
                dv[0, 0, j] -= probs[0, h, j, j] * dout[0, h, j].double()
        with pytest.raises(AssertionError):
            assert_close_backward_tensor_core(dv, refs[2], lowp[2], terms[2], dtype)


def requires_sm80(fn):
    ok = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
    return pytest.mark.skipif(not ok, reason="needs a CUDA GPU of compute capability 8.0+")(fn)


@requires_cuda
@requires_sm80
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", TENSOR_CORE_SCENARIOS)
def test_gpu_tensor_core_autograd_matches_reference(name, dtype, deterministic):
    q, k, v, options = gpu_problem(name, dtype)
    # A tensor-core-eligible scenario (on sm90 the forward's auto pick is the Hopper kernel).
    assert samattn.selected_backend(q, k, v, causal=options.get("causal", False),
                                    kv_stride=options.get("kv_stride", 1)) in ("tensor_core",
                                                                               "hopper")
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = samattn.attention(q, k, v, backend="tensor_core", **options)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to("cuda", dtype)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        poison_cuda_cache(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    # Oracle: the fp64 reference backward on float64 copies of the same inputs and of the
    # forward's out and lse (D = dout . out on both sides, as in FlashAttention).
    _, lse = samattn.attention(q.detach(), k.detach(), v.detach(), return_lse=True,
                               backend="tensor_core", **options)
    cpu = [t.detach().double().cpu() for t in (dout, q, k, v, out)]
    expected = samattn.ops.attention_backward(
        *cpu, lse.double().cpu(), options.get("scale"), options.get("causal", False),
        options.get("kv_stride", 1), False)
    # The tensor-core backward rounds P and dS to the dtype as mma operands (as FlashAttention):
    # helpers.assert_close_backward_tensor_core's rule, against a same-dtype reference on the same
    # inputs and out.
    softmax_scale = abs(options.get("scale") or 1.0 / math.sqrt(q.shape[-1]))
    dp = dout.abs().max().item() * v.abs().max().item()
    floors = (softmax_scale * dp * k.abs().max().item(), softmax_scale * dp * q.abs().max().item(),
              dout.abs().max().item())
    lowp, terms = lowp_backward_reference(dout, q, k, v, out, causal=options.get("causal", False),
                                          scale=options.get("scale"),
                                          kv_stride=options.get("kv_stride", 1))
    for got, ref, like, low, term, floor in zip(grads, expected, (q, k, v), lowp, terms, floors):
        assert got.shape == like.shape and got.dtype == dtype
        assert_close_backward_tensor_core(got, ref, low, term, dtype, scale_floor=floor)


@requires_cuda
@requires_sm80
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gpu_tensor_core_deterministic_autograd_is_bit_identical(dtype, head_dim):
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 8, 2, 333, 333, head_dim, dtype=dtype,
                                                    device="cuda", seed=5))
    out = samattn.attention(q, k, v, causal=True, backend="tensor_core")
    dout = torch.randn_like(out)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        second = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@requires_cuda
def test_gpu_backward_backend_follows_the_forward():
    """backend="simt" reaches the backward too; "tensor_core" where it cannot run is an error."""
    q, k, v = make_qkv(1, 2, 2, 40, 50, 72, dtype=torch.bfloat16, device="cuda", seed=6)
    out, lse = samattn.attention(q, k, v, return_lse=True)
    dout = torch.randn_like(out)
    with pytest.raises(ValueError, match="head_dim 72"):
        samattn.ops.attention_backward(dout, q, k, v, out, lse, None, False, 1, False,
                                       "tensor_core")
    simt = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, False, 1, False, "simt")
    auto = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, False, 1, False)
    for a, b in zip(simt, auto):  # head dim 72 has no tensor-core backward: both run SIMT
        assert torch.equal(a, b)


# The Hopper backward (sm_90a wgmma + TMA; fp16/bf16, head dims 64, 96, 128, 192 and 256, compute
# capability 9.0): every GPU scenario it supports plus a few of its own, through autograd with
# backend="hopper", atomic and deterministic dq, against the fp64 reference with the tensor-core
# rule (it rounds P and dS where the sm80 kernels do).
HOPPER_SCENARIOS_EXTRA = {
    "mqa_causal_128": dict(shape=(1, 6, 1, 77, 129, 128, 128), causal=True),
    "strided3_gqa_64": dict(shape=(1, 8, 2, 100, 200, 64, 64), kv_stride=3),
    "sq_gt_sk_128": dict(shape=(1, 2, 2, 300, 129, 128, 128)),
    "gqa_4to1_causal_256": dict(shape=(1, 8, 2, 130, 140, 256, 256), causal=True),
    "strided2_causal_96": dict(shape=(1, 4, 2, 150, 150, 96, 96), causal=True, kv_stride=2),
}
GPU_SCENARIOS.update(HOPPER_SCENARIOS_EXTRA)
HOPPER_SCENARIOS = [name for name, sc in GPU_SCENARIOS.items()
                    if sc["shape"][5] == sc["shape"][6]
                    and sc["shape"][5] in (64, 96, 128, 192, 256)]


def hopper_backward_skip_reason():
    """Why the Hopper backward cannot run here ("" when it can): it needs a compute capability 9.0
    GPU and a build with the sm_90a kernels. On such a GPU any other refusal is a bug: raised."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "needs a compute capability 9.0 GPU"
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16, device="cuda")
    try:
        assert samattn.selected_backend(q, q, q, backend="hopper", backward=True) == "hopper"
    except ValueError as error:
        if "this build" in str(error):
            return f"hopper backward unavailable: {error}"
        raise
    return ""


def requires_hopper_backward(fn):
    reason = hopper_backward_skip_reason()
    return pytest.mark.skipif(bool(reason), reason=reason)(fn)


@requires_hopper_backward
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", HOPPER_SCENARIOS)
def test_gpu_hopper_autograd_matches_reference(name, dtype, deterministic):
    q, k, v, options = gpu_problem(name, dtype)
    causal, kv_stride = options.get("causal", False), options.get("kv_stride", 1)
    assert samattn.selected_backend(q, k, v, causal=causal, kv_stride=kv_stride, backend="hopper",
                                    backward=True) == "hopper"
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = samattn.attention(q, k, v, backend="hopper", return_lse=True, **options)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to("cuda", dtype)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        poison_cuda_cache(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    cpu = [t.detach().double().cpu() for t in (dout, q, k, v, out)]
    expected = samattn.ops.attention_backward(*cpu, lse.double().cpu(), options.get("scale"),
                                              causal, kv_stride, False)
    softmax_scale = abs(options.get("scale") or 1.0 / math.sqrt(q.shape[-1]))
    dp = dout.abs().max().item() * v.abs().max().item()
    floors = (softmax_scale * dp * k.abs().max().item(), softmax_scale * dp * q.abs().max().item(),
              dout.abs().max().item())
    lowp, terms = lowp_backward_reference(dout, q, k, v, out, causal=causal,
                                          scale=options.get("scale"), kv_stride=kv_stride)
    for got, ref, like, low, term, floor in zip(grads, expected, (q, k, v), lowp, terms, floors):
        assert got.shape == like.shape and got.dtype == dtype
        assert_close_backward_tensor_core(got, ref, low, term, dtype, scale_floor=floor)


@requires_hopper_backward
def test_gpu_auto_backward_picks_hopper_and_forced_hopper_names_the_reason():
    """backend="auto" takes the Hopper backward at head dims 64, 96, 128, 192 and 256 on sm90, the
    sm80 one at 32; backend="hopper" where the backward cannot run raises, naming the reason."""
    def pick(head_dim, **kwargs):
        q = torch.zeros(1, 2, 16, head_dim, dtype=torch.bfloat16, device="cuda")
        return samattn.selected_backend(q, q, q, backward=True, **kwargs)
    assert [pick(d) for d in (64, 96, 128, 192, 256)] == ["hopper"] * 5
    assert pick(32) == "tensor_core"
    assert pick(128, backend="tensor_core") == "tensor_core"
    assert pick(128, backend="simt") == "simt"
    with pytest.raises(ValueError, match="head_dim 32"):
        pick(32, backend="hopper")


@requires_cuda
def test_gpu_backward_never_picks_hopper_off_sm90():
    if not hopper_backward_skip_reason():
        pytest.skip("the Hopper backward runs on this device")
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16, device="cuda")
    assert samattn.selected_backend(q, q, q, backward=True) != "hopper"
    with pytest.raises(ValueError, match="backend hopper does not support"):
        samattn.selected_backend(q, q, q, backward=True, backend="hopper")


@requires_cuda
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(kv_stride=2, causal=True)],
                         ids=["dense", "causal", "strided_causal"])
def test_gpu_gradcheck_fp64(options):
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 2, 9, 11, 5, 6, dtype=torch.float64,
                                                    device="cuda", seed=3))
    assert torch.autograd.gradcheck(lambda q, k, v: samattn.attention(q, k, v, **options),
                                    (q, k, v))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_cuda_graph_forward_backward(dtype):
    shapes = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=70, seqlen_k=70, head_dim=64)

    def fresh(seed):
        q, k, v = make_qkv(*shapes.values(), dtype=dtype, device="cuda", seed=seed)
        return q, k, v, torch.randn(q.shape, device="cuda").to(dtype)

    static = [t.clone().requires_grad_(i < 3) for i, t in enumerate(fresh(0))]

    def step():
        q, k, v, dout = static
        out = samattn.attention(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up the allocator outside the capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for seed in (1, 2):
        inputs = fresh(seed)
        with torch.no_grad():
            for dst, src in zip(static, inputs):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs))
        out = samattn.attention(q, k, v, causal=True)
        eager = (out, *torch.autograd.grad(out, (q, k, v), dout))
        for got, want in zip(captured, eager):
            assert torch.equal(got, want)


@requires_cuda
def test_gpu_strided_attention_module_trains():
    torch.manual_seed(0)
    module = samattn.nn.StridedAttention(64, 4, stride=3, device="cuda")
    x = torch.randn(4, 100, 64, device="cuda")
    losses = train(module, x, torch.randn_like(x), steps=10, lr=0.1)
    assert losses[-1] < losses[0]
