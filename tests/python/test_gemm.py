"""samattn.gemm, samattn.softmax and samattn.attention_unfused against fp64 oracles.

GEMM bound (per element, deterministic): |c - ref| <= u_out |ref| + (K + 2) u_acc
(|alpha| (|A||B|) + |beta| |C|), u_out the output dtype's unit roundoff, u_acc float32's (x2 on
tensor cores, whose accumulation may truncate) or float64's; TF32 (inputs cut to 10 mantissa
bits by the tensor cores) adds 2 * 2^-10 |alpha| |A||B|.
"""

import math

import pytest
import torch

import samattn
from helpers import ALL_DTYPES, HAS_CUDA, assert_close, reference_attention, requires_cuda

TENSOR_CORE_KERNELS = ("sm90_wgmma", "sm80_mma")
_U_OUT = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11,
          torch.bfloat16: 2.0**-8}


def _rand(*shape, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def assert_gemm_close(out, a, b, *, alpha=1.0, beta=0.0, c=None, kernel="simt", tf32=False):
    dtype = a.dtype
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    ref = alpha * (a64 @ b64)
    src = torch.zeros_like(ref)
    if beta != 0.0:
        src = beta * c.double().cpu()
        ref = ref + src
    prod = abs(alpha) * (a64.abs() @ b64.abs())
    u_acc = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    tensor_cores = kernel in TENSOR_CORE_KERNELS
    if tensor_cores:
        u_acc *= 2
    k = a.shape[-1]
    accumulated = ((k + 2) * u_acc * (prod + src.abs())
                   + (2 * 2.0**-10 * prod if tf32 and tensor_cores else 0.0))
    bound = _U_OUT[dtype] * ref.abs() + (1 + _U_OUT[dtype]) * accumulated
    if dtype == torch.float16:
        bound = bound + 2.0**-24  # subnormal grid
    got = out.detach().double().cpu()
    assert got.shape == ref.shape
    assert not torch.isnan(got).any(), "NaN in the output"
    err = (got - ref).abs()
    bad = err > bound
    assert not bad.any(), (f"{int(bad.sum())} of {ref.numel()} elements out of bound; max "
                           f"err/bound {(err / bound).max().item():.3g} ({kernel})")


# ---- CPU: the reference path and validation ------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cpu_gemm_matches_torch_fp64(dtype):
    a, b = _rand(7, 129, dtype=dtype, seed=1), _rand(129, 5, dtype=dtype, seed=2)
    assert_gemm_close(samattn.gemm(a, b), a, b)


def test_cpu_gemm_transposed_batched_alpha_beta_out():
    a = _rand(3, 9, 4, dtype=torch.float32, seed=3).transpose(1, 2)  # (3, 4, 9) strided
    b = _rand(3, 6, 9, dtype=torch.float32, seed=4).transpose(1, 2)  # (3, 9, 6)
    c = _rand(3, 4, 6, dtype=torch.float32, seed=5)
    c0 = c.clone()
    out = samattn.gemm(a, b, out=c, alpha=0.5, beta=-1.0)
    assert out is c
    assert_gemm_close(out, a, b, alpha=0.5, beta=-1.0, c=c0)


def test_cpu_gemm_beta_zero_ignores_nan_out():
    a, b = _rand(4, 3, dtype=torch.float32, seed=6), _rand(3, 5, dtype=torch.float32, seed=7)
    out = torch.full((4, 5), float("nan"))
    samattn.gemm(a, b, out=out)
    assert_gemm_close(out, a, b)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_softmax_matches_torch(dtype, causal):
    x = _rand(2, 5, 7, dtype=dtype, seed=8)
    got = samattn.softmax(x, scale=0.5, causal=causal)
    s = 0.5 * x.double()
    if causal:
        s = s.masked_fill(torch.ones(5, 7, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(got, torch.softmax(s, dim=-1), dtype)


GEMM_BAD = [
    ("rank", lambda a, b: (a[0], b), ValueError, "b must have a's rank"),
    ("rank 1", lambda a, b: (a[0, 0], b[0, 0]), ValueError, "a must be 2-D"),
    ("k mismatch", lambda a, b: (a, b[:, :2]), ValueError,
     r"b.shape\[-2\] \(2\) must equal a.shape\[-1\] \(3\)"),
    ("batch", lambda a, b: (a, b[:1]), ValueError, "batch sizes differ: a 2, b 1"),
    ("dtype int", lambda a, b: (a.int(), b.int()), TypeError, "a dtype must be one of"),
    ("mixed dtype", lambda a, b: (a, b.double()), TypeError,
     r"b dtype \(Double\) must match a dtype \(Float\)"),
    ("none", lambda a, b: (a, None), (TypeError, ValueError), "b|Tensor"),
]


@pytest.mark.parametrize("name,mutate,error,message", GEMM_BAD, ids=[c[0] for c in GEMM_BAD])
def test_gemm_bad_input_raises_named_error(name, mutate, error, message):
    a, b = torch.randn(2, 4, 3), torch.randn(2, 3, 5)
    with pytest.raises(error, match=message):
        samattn.gemm(*mutate(a, b))


def test_gemm_bad_backend_name_raises():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'simt', 'sm80', 'sm90', "
                                         "got 'tensor_core'"):
        samattn.gemm(a, b, backend="tensor_core")


def test_cpu_gemm_ignores_backend():
    """CPU tensors run the fp64 reference whatever backend is asked for."""
    a, b = _rand(5, 9, dtype=torch.float32, seed=13), _rand(9, 4, dtype=torch.float32, seed=14)
    for backend in ("simt", "sm80", "sm90"):
        assert_gemm_close(samattn.gemm(a, b, backend=backend), a, b)


def test_gemm_bad_out_is_rejected_and_untouched():
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    for out, message in [(torch.zeros(4, 6), r"out must have shape \[4, 5\], got \[4, 6\]"),
                         (torch.zeros(4, 5, dtype=torch.float64), r"out dtype \(Double\)")]:
        before = out.clone()
        with pytest.raises((ValueError, TypeError), match=message):
            samattn.gemm(a, b, out=out)
        assert torch.equal(out, before)
    with pytest.raises(ValueError, match="beta needs out="):
        samattn.gemm(a, b, beta=1.0)
    with pytest.raises(ValueError, match="overlap|internal"):
        samattn.gemm(a, b, out=torch.zeros(1, 1).expand(4, 5))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gemm_mixed_devices_rejected():
    with pytest.raises(ValueError, match="b is on cpu but a is on cuda"):
        samattn.gemm(torch.randn(2, 2, device="cuda"), torch.randn(2, 2))


def test_softmax_bad_input():
    with pytest.raises(TypeError, match="x dtype must be one of"):
        samattn.softmax(torch.zeros(3, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="causal softmax needs x with at least 2 dimensions"):
        samattn.softmax(torch.zeros(3), causal=True)


def test_attention_unfused_bad_input():
    q = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="k head_dim"):
        samattn.attention_unfused(q, torch.randn(2, 5, 4), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="v seq_len"):
        samattn.attention_unfused(q, q, torch.randn(2, 6, 8))
    with pytest.raises(ValueError, match="same rank"):
        samattn.attention_unfused(q, q[0], q)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_attention_unfused_float64_matches_reference(causal):
    q, k, v = (_rand(2, 3, 9, 8, dtype=torch.float64, seed=s) for s in (10, 11, 12))
    v = v[..., :5].contiguous()
    ref, _ = reference_attention(q, k, v, causal=causal)
    assert_close(samattn.attention_unfused(q, k, v, causal=causal), ref, torch.float64)


# ---- GPU -------------------------------------------------------------------------------------

SIZES = [1, 7, 129, 1000]
SHAPES = ([(s, 72, 136) for s in SIZES] + [(136, s, 72) for s in SIZES]
          + [(72, 136, s) for s in SIZES] + [(256, 264, 200), (1000, 129, 1000)])


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gpu_gemm_matches_reference(dtype, m, n, k):
    a = _rand(m, k, dtype=dtype, device="cuda", seed=m + 3 * n + 7 * k)
    b = _rand(k, n, dtype=dtype, device="cuda", seed=m + n + k)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    samattn.gemm(a, b, out=out)
    assert_gemm_close(out, a, b, kernel=samattn.gemm_kernel(a, b))


LAYOUTS = ["nn", "tn", "nt", "tt", "c_t", "batched", "broadcast", "alpha_beta", "padded"]


def _layout_operands(layout, dtype, m, n, k):
    """A, B and out (poisoned unless beta != 0) in `layout`, with its alpha and beta."""
    def make(rows, cols, transposed, seed, batch=None):
        shape = (cols, rows) if transposed else (rows, cols)
        if batch is not None:
            shape = (batch, *shape)
        t = _rand(*shape, dtype=dtype, device="cuda", seed=seed)
        return t.transpose(-1, -2) if transposed else t

    batch = 3 if layout in ("batched", "broadcast") else None
    a = make(m, k, layout in ("tn", "tt"), 1, batch)
    b = make(k, n, layout in ("nt", "tt"), 2, None if layout == "broadcast" else batch)
    if layout == "broadcast":
        b = b.expand(3, k, n)
    if layout == "padded":
        a = _rand(m, k + 8, dtype=dtype, device="cuda", seed=3)[:, :k]
        b = _rand(k, n + 8, dtype=dtype, device="cuda", seed=4)[:, :n]
    out_shape = (m, n) if batch is None else (batch, m, n)
    alpha, beta = (-0.75, 1.5) if layout == "alpha_beta" else (1.0, 0.0)
    if layout == "c_t":
        out = torch.full(out_shape[::-1], float("nan"), dtype=dtype, device="cuda").T
    elif beta != 0.0:
        out = _rand(*out_shape, dtype=dtype, device="cuda", seed=5)
    else:
        out = torch.full(out_shape, float("nan"), dtype=dtype, device="cuda")
    return a, b, out, out.clone(), alpha, beta


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(256, 264, 200), (129, 7, 1000)])
def test_gpu_gemm_layouts(dtype, layout, m, n, k):
    a, b, out, c0, alpha, beta = _layout_operands(layout, dtype, m, n, k)
    kernel = samattn.gemm_kernel(a, b)
    samattn.gemm(a, b, out=out, alpha=alpha, beta=beta)
    assert_gemm_close(out, a, b, alpha=alpha, beta=beta, c=c0, kernel=kernel)


@requires_cuda
@pytest.mark.parametrize("m,n,k", [(256, 264, 200), (1000, 136, 1000), (129, 7, 1000)])
def test_gpu_gemm_tf32(m, n, k):
    a = _rand(m, k, dtype=torch.float32, device="cuda", seed=1)
    b = _rand(n, k, dtype=torch.float32, device="cuda", seed=2).T
    kernel = samattn.gemm_kernel(a, b, allow_tf32=True)
    out = samattn.gemm(a, b, allow_tf32=True)
    assert_gemm_close(out, a, b, kernel=kernel, tf32=True)
    assert samattn.gemm_kernel(a, b) == "simt"  # IEEE unless allowed


@requires_cuda
def test_gpu_sm90_path_taken_for_aligned_16bit():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm90 only")
    for dtype in (torch.float16, torch.bfloat16):
        a = torch.randn(256, 256, device="cuda", dtype=dtype)
        assert samattn.gemm_kernel(a, a) == "sm90_wgmma"
        assert samattn.gemm_kernel(a, a.T) == "sm90_wgmma"
        assert samattn.gemm_kernel(a.T, a) == "sm90_wgmma"


def _capability_major():
    return torch.cuda.get_device_capability()[0] if HAS_CUDA else 0


# Each forced kernel family in each dtype it runs: (backend, dtype, allow_tf32, kernel name).
FORCED = [("sm80", torch.float16, False, "sm80_mma"), ("sm80", torch.bfloat16, False, "sm80_mma"),
          ("sm80", torch.float32, True, "sm80_mma"), ("simt", torch.float16, False, "simt"),
          ("simt", torch.bfloat16, False, "simt"), ("simt", torch.float32, False, "simt")]
FORCED_IDS = [f"{b}-{'tf32' if t else str(d).split('.')[-1]}" for b, d, t, _ in FORCED]


def _skip_unless_runs(backend):
    if backend == "sm80" and _capability_major() < 8:
        pytest.skip("the sm80 kernel needs compute capability 8.0+")


@requires_cuda
@pytest.mark.parametrize("backend,dtype,tf32,kernel", FORCED, ids=FORCED_IDS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_gpu_gemm_forced_backend_matches_reference(backend, dtype, tf32, kernel, m, n, k):
    _skip_unless_runs(backend)
    a = _rand(m, k, dtype=dtype, device="cuda", seed=m + 3 * n + 7 * k + 1)
    b = _rand(k, n, dtype=dtype, device="cuda", seed=m + n + k + 1)
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    assert samattn.gemm_kernel(a, b, allow_tf32=tf32, backend=backend) == kernel
    samattn.gemm(a, b, out=out, allow_tf32=tf32, backend=backend)
    assert_gemm_close(out, a, b, kernel=kernel, tf32=tf32)


@requires_cuda
@pytest.mark.parametrize("backend,dtype,tf32,kernel", FORCED[:3], ids=FORCED_IDS[:3])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(256, 264, 200), (129, 7, 1000), (200, 136, 1001)])
def test_gpu_gemm_forced_sm80_layouts(backend, dtype, tf32, kernel, layout, m, n, k):
    """Every operand layout (k-major and mn-major A and B, column-major C, batches, a broadcast
    B, padded rows) on the sm80 kernel, with aligned and ragged sizes and a K tail."""
    _skip_unless_runs(backend)
    a, b, out, c0, alpha, beta = _layout_operands(layout, dtype, m, n, k)
    assert samattn.gemm_kernel(a, b, allow_tf32=tf32, backend=backend) == kernel
    samattn.gemm(a, b, out=out, alpha=alpha, beta=beta, allow_tf32=tf32, backend=backend)
    assert_gemm_close(out, a, b, alpha=alpha, beta=beta, c=c0, kernel=kernel, tf32=tf32)


@requires_cuda
def test_gpu_gemm_forced_backend_errors_say_why():
    a = torch.randn(64, 64, device="cuda")
    with pytest.raises(ValueError, match="backend sm80 runs float16, bfloat16 or float32 with "
                                         "allow_tf32"):
        samattn.gemm(a, a, backend="sm80")
    with pytest.raises(ValueError, match="backend sm90 runs"):
        samattn.gemm(a.double(), a.double(), backend="sm90")
    odd = torch.randn(64, 67, device="cuda", dtype=torch.float16)[:, :64]  # rows off 16 bytes
    with pytest.raises(ValueError, match="backend sm90 cannot run this GEMM"):
        samattn.gemm(odd, odd.T, backend="sm90")
    out = torch.zeros(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="backend sm90"):
        samattn.gemm(odd, odd.T, out=out, backend="sm90")
    assert not out.any(), "nothing may be written when the call is rejected"


@requires_cuda
def test_gpu_auto_uses_sm80_where_sm90_cannot():
    if _capability_major() < 8:
        pytest.skip("sm80+ only")
    odd = torch.randn(96, 99, device="cuda", dtype=torch.bfloat16)[:, :96]
    assert samattn.gemm_kernel(odd, odd) == "sm80_mma"
    rows = torch.randn(96, 96, device="cuda")
    assert samattn.gemm_kernel(rows, rows, allow_tf32=True) in TENSOR_CORE_KERNELS


@requires_cuda
@pytest.mark.parametrize("backend,dtype,tf32,kernel", FORCED, ids=FORCED_IDS)
@pytest.mark.parametrize("m,n,k", [(512, 512, 512), (16, 4096, 1024), (333, 77, 515)])
def test_gpu_forced_backend_cross_check_with_cublas(backend, dtype, tf32, kernel, m, n, k):
    """torch.matmul (cuBLAS, TF32 when tf32) as a second opinion on each forced kernel: both
    within the bound of the fp64 reference."""
    _skip_unless_runs(backend)
    a = _rand(m, k, dtype=dtype, device="cuda", seed=21)
    b = _rand(k, n, dtype=dtype, device="cuda", seed=22)
    ours = samattn.gemm(a, b, allow_tf32=tf32, backend=backend)
    assert_gemm_close(ours, a, b, kernel=kernel, tf32=tf32)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        theirs = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert_gemm_close(theirs, a, b, kernel="sm90_wgmma", tf32=tf32)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(512, 512, 512), (16, 4096, 1024), (333, 77, 515)])
def test_gpu_gemm_cross_check_with_cublas(dtype, m, n, k):
    """torch.matmul (cuBLAS) as a second opinion: both within the bound of the fp64 reference,
    and within twice the bound of each other."""
    a = _rand(m, k, dtype=dtype, device="cuda", seed=11)
    b = _rand(k, n, dtype=dtype, device="cuda", seed=12)
    ours = samattn.gemm(a, b)
    kernel = samattn.gemm_kernel(a, b)
    assert_gemm_close(ours, a, b, kernel=kernel)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        theirs = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert_gemm_close(theirs, a, b, kernel="sm90_wgmma")


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cols", [1, 7, 129, 1000, 4097])
def test_gpu_softmax_matches_reference(dtype, causal, cols):
    x = 3 * _rand(2, 33, cols, dtype=dtype, device="cuda", seed=cols)
    got = samattn.softmax(x, scale=0.7, causal=causal)
    ref = samattn.softmax(x.cpu(), scale=0.7, causal=causal)  # fp64 reference, rounded to dtype
    assert_close(got, ref, dtype)


def _unfused_mirror(q, k, v, scale, causal):
    """The unfused design's rounding points in fp64: S and P rounded to the dtype, then P V."""
    dtype = q.dtype
    s = (scale * (q.double() @ k.double().transpose(-1, -2))).to(dtype).double()
    if causal:
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1).to(dtype).double()
    return (p @ v.double()).to(dtype).double()


@requires_cuda
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 129, 77, 64), (1, 2, 256, 256, 128), (1, 1, 7, 1000, 32)])
def test_gpu_attention_unfused_matches_fp64_reference(dtype, causal, shape):
    b, h, sq, sk, d = shape
    q = _rand(b, h, sq, d, dtype=dtype, device="cuda", seed=1)
    k = _rand(b, h, sk, d, dtype=dtype, device="cuda", seed=2)
    v = _rand(b, h, sk, d, dtype=dtype, device="cuda", seed=3)
    out = samattn.attention_unfused(q, k, v, causal=causal)
    check_unfused(out, q, k, v, causal)


def check_unfused(out, q, k, v, causal):
    """fp32/fp64: the dtype tolerance against the fp64 attention reference. fp16/bf16:
    FlashAttention-3's rule against a mirror of the design's rounding (S and P stored in the
    dtype): our error at most twice the mirror's plus one unit roundoff of the output scale."""
    dtype = q.dtype
    ref, _ = reference_attention(q, k, v, causal=causal)
    ref = ref.reshape(out.shape)
    if dtype in (torch.float64, torch.float32):
        assert_close(out, ref, dtype)
        return
    mirror = _unfused_mirror(q.cpu(), k.cpu(), v.cpu(), 1 / math.sqrt(q.shape[-1]), causal)
    got = out.double().cpu()
    ours = (got - ref).abs().max().item()
    baseline = (mirror.reshape(out.shape) - ref).abs().max().item()
    bound = 2 * baseline + _U_OUT[dtype] * ref.abs().max().item()
    assert not torch.isnan(got).any()
    assert ours <= bound, f"max error {ours:.3e} > {bound:.3e}"


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_self_attention_unfused_matches_reference(dtype):
    x = _rand(300, 64, dtype=dtype, device="cuda", seed=4)
    output = torch.full_like(x, float("nan"))
    returned = samattn.self_attention(x, output, 64, fused=False)
    assert returned is output
    view = x[None, None]
    check_unfused(output[None, None], view, view, view, False)


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
def test_cpu_gemm_gradients(batched):
    """Gradients of alpha a b (a transposed view for a), and of their gradients (the backward's
    GEMMs run through the same operator)."""
    shape_a, shape_b = ((2, 5, 3), (2, 5, 4)) if batched else ((5, 3), (5, 4))
    a = _rand(*shape_a, dtype=torch.float64, seed=1).transpose(-1, -2).requires_grad_()
    b = _rand(*shape_b, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: samattn.gemm(a, b, alpha=0.7), (a, b))
    assert torch.autograd.gradgradcheck(lambda a, b: samattn.gemm(a, b, alpha=0.7), (a, b))
    # Only the operand that asks gets a gradient.
    frozen = b.detach()
    da, = torch.autograd.grad(samattn.gemm(a, frozen).sum(), (a,))
    assert_close(da, torch.ones(a.shape[:-1] + (4,), dtype=torch.float64) @ frozen.mT,
                 torch.float64)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_softmax_gradients(causal):
    x = _rand(2, 4, 6, dtype=torch.float64, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: samattn.softmax(x, scale=0.6, causal=causal), (x,))
    assert torch.autograd.gradgradcheck(lambda x: samattn.softmax(x, scale=0.6, causal=causal),
                                        (x,))


def test_cpu_attention_unfused_gradients():
    """Seed 002's unfused design (GEMM, softmax, GEMM) is differentiable through those ops."""
    q, k, v = (_rand(1, 2, 5, 4, dtype=torch.float64, seed=s).requires_grad_() for s in (4, 5, 6))
    assert torch.autograd.gradcheck(
        lambda q, k, v: samattn.attention_unfused(q, k, v, causal=True), (q, k, v))


def test_gemm_with_out_refuses_gradients():
    a = _rand(3, 4, dtype=torch.float64).requires_grad_()
    b = _rand(4, 5, dtype=torch.float64)
    out = torch.empty(3, 5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="not differentiable"):
        samattn.gemm(a, b, out=out)
    with pytest.raises(RuntimeError, match="not differentiable"):
        samattn.ops.gemm_out(a, b, out, 1.0, 0.0, False, "auto")
    with torch.no_grad():
        version = out._version
        assert samattn.gemm(a, b, out=out) is out
        assert out._version > version  # the write is visible to autograd's saved-tensor checks


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_ops_pass_opcheck(device):
    """Schema, fake (meta) implementations and autograd registration of the GEMM ops."""
    a = torch.randn(3, 4, 8, device=device)
    b = torch.randn(3, 8, 16, device=device)
    out = torch.empty(3, 4, 16, device=device)
    for op, args in [(torch.ops.samattn.gemm.default, (a, b, 0.5, False)),
                     (torch.ops.samattn.gemm.default, (a, b, 0.5, False, "simt")),
                     (torch.ops.samattn.gemm_out.default, (a, b, out, 1.0, 0.0, False)),
                     (torch.ops.samattn.softmax.default, (a, 0.5, True))]:
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), result
