"""Reliability on the GPU: property-based fuzzing per dtype against a float64 oracle, edge shapes,
non-finite and large inputs, tensors beyond 2^31 elements, streams, CUDA graphs, host
synchronisation, memory that stays flat over 10,000 calls, peak memory and determinism.
Skipped without a GPU.

The fuzz oracle is the float64 attention formula evaluated with torch on the GPU
(helpers.torch_math_attention, itself checked against samattn's C++ float64 reference by
test_reference_cpu.py); it keeps 2,000+ cases per run within seconds."""

from __future__ import annotations

import gc
import math
import os
import resource

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import samattn
from helpers import (ALL_DTYPES, assert_close, assert_close_tensor_core, lowp_reference, make_qkv,
                     requires_cuda, score_error_floor, torch_math_attention)

pytestmark = requires_cuda

FUZZ_EXAMPLES = int(os.environ.get("SAMATTN_FUZZ_EXAMPLES", "60"))
_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def oracle(q, k, v, **options):
    """float64 attention on the GPU; rows that see no key give 0 (samattn's convention)."""
    if k.shape[2] == 0:
        shape = (*q.shape[:3], v.shape[-1])
        return (torch.zeros(shape, dtype=torch.float64, device=q.device),
                torch.full(shape[:3], float("-inf"), dtype=torch.float64, device=q.device))
    out, lse = torch_math_attention(q, k, v, **options)
    return out.nan_to_num(nan=0.0), lse


def check_forward(out, q, k, v, used, **options):
    ref, _ = oracle(q, k, v, **options)
    if used == "simt":
        assert_close(out, ref, q.dtype,
                     scale_floor=score_error_floor(q, k, v, options.get("scale"), q.dtype))
    else:
        assert_close_tensor_core(out, ref, lowp_reference(q, k, v, **options), q.dtype)


def run_poisoned(q, k, v, backend="auto", **options):
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    samattn.ops.attention_forward_into(q, k, v, out, options.get("scale"),
                                       options.get("causal", False), options.get("kv_stride", 1),
                                       backend)
    return out


# ---------------------------------------------------------------------------------------------
# Property-based fuzzing: FUZZ_EXAMPLES cases per dtype (gpu-check runs 500).

problems = dict(
    batch=st.integers(1, 3), heads_kv=st.integers(1, 3), group=st.sampled_from([1, 2, 4]),
    seqlen_q=st.integers(1, 300), seqlen_k=st.integers(0, 300),
    head_dim=st.sampled_from([1, 8, 16, 32, 40, 64, 72, 96, 128, 192, 256]),
    causal=st.booleans(), kv_stride=st.sampled_from([1, 1, 2, 3, 4, 7]),
    layout=st.sampled_from(["bhsd", "bshd"]), scale=st.sampled_from([None, None, 0.05, 1.0]),
    backend=st.sampled_from(["auto", "simt"]), seed=st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_forward_fuzz_per_dtype(dtype):
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(**problems)
    def case(batch, heads_kv, group, seqlen_q, seqlen_k, head_dim, causal, kv_stride, layout,
             scale, backend, seed):
        q, k, v = make_qkv(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k, head_dim,
                           dtype=dtype, device="cuda", layout=layout, seed=seed)
        options = dict(causal=causal, kv_stride=kv_stride, scale=scale)
        out = run_poisoned(q, k, v, backend, **options)
        used = samattn.selected_backend(q, k, v, causal=causal, kv_stride=kv_stride,
                                        backend=backend)
        check_forward(out, q, k, v, used, **options)

    case()


# More work units (query tiles) than SMs, so each persistent block chains several tiles of
# different heads, sequences and lengths: the tile-to-tile protocol (the lookahead, the staged
# output, a warpgroup without rows in a tile) runs on every call. 2 x 16..32 heads x Sq >= 1000 is
# at least 192 tiles of 192 rows, above the 132 SMs of an H100 or H200 (the shapes of the other
# fuzz have fewer units than SMs: a deadlock of stop 38 slipped through them). fp16 and bf16,
# where the Hopper path runs.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_forward_fuzz_with_more_tiles_than_sms(dtype):
    @settings(max_examples=max(FUZZ_EXAMPLES // 10, 6), deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(heads=st.sampled_from([(16, 1), (8, 2), (4, 4), (32, 1), (8, 4)]),
           seqlen_q=st.integers(1000, 2100), seqlen_k=st.integers(1, 2100),
           head_dim=st.sampled_from([64, 96, 128, 192, 256]), causal=st.booleans(),
           kv_stride=st.sampled_from([1, 1, 2, 3, 4]), seed=st.integers(0, 2**31 - 1))
    def case(heads, seqlen_q, seqlen_k, head_dim, causal, kv_stride, seed):
        heads_kv, group = heads
        q, k, v = make_qkv(2, heads_kv * group, heads_kv, seqlen_q, seqlen_k, head_dim,
                           dtype=dtype, device="cuda", seed=seed)
        options = dict(causal=causal, kv_stride=kv_stride, scale=None)
        out = run_poisoned(q, k, v, **options)
        used = samattn.selected_backend(q, k, v, causal=causal, kv_stride=kv_stride)
        check_forward(out, q, k, v, used, **options)

    case()


def term_scales(q, k, v, dout, scale):
    """The size of the terms each gradient sums: dq ~ scale·|dout||v|·|k|, dk ~ scale·|dout||v|·|q|,
    dv ~ |dout| (probabilities sum to 1)."""
    softmax_scale = abs(scale or 1.0 / math.sqrt(q.shape[-1]))
    dp = dout.abs().max().item() * v.abs().max().item()
    return (softmax_scale * dp * k.abs().max().item(), softmax_scale * dp * q.abs().max().item(),
            dout.abs().max().item())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_backward_fuzz_per_dtype(dtype):
    """Gradients against float64 autograd of the formula. fp64/fp32: the forward's tolerance
    with the error scale of the summed terms; fp16/bf16: at most twice the error of torch's own
    SDPA gradients in the same dtype (FlashAttention-3's rule), plus a unit roundoff."""

    @settings(max_examples=max(FUZZ_EXAMPLES // 4, 10), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(**{**problems, "seqlen_k": st.integers(1, 300),
              "head_dim": st.sampled_from([8, 16, 32, 64, 96, 128, 256])})
    def case(batch, heads_kv, group, seqlen_q, seqlen_k, head_dim, causal, kv_stride, layout,
             scale, backend, seed):
        q, k, v = make_qkv(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k, head_dim,
                           dtype=dtype, device="cuda", layout=layout, seed=seed)
        options = dict(causal=causal, kv_stride=kv_stride, scale=scale)
        dout = torch.randn((*q.shape[:3], v.shape[-1]), device="cuda").to(dtype)
        ours = torch.autograd.grad(
            samattn.attention(*(t.requires_grad_() for t in (q, k, v)), backend=backend,
                              **options), (q, k, v), dout)
        exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref_out, _ = torch_math_attention(*exact, **options)
        visible = torch.isfinite(ref_out)  # rows with no visible key: zero gradient
        refs = torch.autograd.grad(ref_out.nan_to_num(0.0), exact,
                                   dout.double() * visible)
        refs = [r.nan_to_num(0.0) for r in refs]
        if dtype in (torch.float64, torch.float32):
            for got, ref, floor in zip(ours, refs, term_scales(q, k, v, dout, scale)):
                assert_close(got, ref, dtype, scale_floor=floor)
            return
        lowp = [t.detach().requires_grad_() for t in (q, k, v)]
        kk, vv = lowp[1][:, :, ::kv_stride], lowp[2][:, :, ::kv_stride]
        if causal and kv_stride > 1:
            return  # SDPA has no mask for strided-causal without a dense mask; fp32 covers it
        torch_out = F.scaled_dot_product_attention(lowp[0], kk, vv, is_causal=causal,
                                                   scale=scale, enable_gqa=True)
        torch_grads = torch.autograd.grad(torch_out, lowp, dout)
        # The unit-roundoff term scales with the summed terms, not the result: a gradient that
        # cancels to ~0 (a row with one key) still carries rounding of its terms' size.
        for got, ref, base, floor in zip(ours, refs, torch_grads, term_scales(q, k, v, dout, scale)):
            assert not torch.isnan(got).any()
            err = (got.double() - ref).abs().max().item()
            baseline = (base.double() - ref).abs().max().item()
            bound = 2 * baseline + _UNIT_ROUNDOFF[dtype] * max(ref.abs().max().item(), floor)
            assert err <= bound, (err, baseline, bound)

    case()


# ---------------------------------------------------------------------------------------------
# Edge shapes.

EDGES = {
    "batch_0": (0, 2, 2, 5, 5, 64),
    "seqlen_q_0": (1, 2, 2, 0, 5, 64),
    "seqlen_k_0": (1, 2, 2, 5, 0, 64),
    "seqlen_1": (2, 2, 2, 1, 1, 64),
    "head_dim_1": (1, 2, 2, 33, 47, 1),
    "head_dim_256": (1, 2, 1, 130, 70, 256),
    "sq_much_greater": (1, 2, 2, 4096, 3, 64),
    "sk_much_greater": (1, 2, 2, 1, 8192, 64),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(EDGES))
@pytest.mark.parametrize("causal", [False, True])
def test_edge_shapes(name, dtype, causal):
    q, k, v = make_qkv(*EDGES[name], dtype=dtype, device="cuda", seed=len(name))
    out = run_poisoned(q, k, v, causal=causal)
    used = samattn.selected_backend(q, k, v, causal=causal)
    check_forward(out, q, k, v, used, causal=causal)
    if q.numel() and k.numel():
        grads = torch.autograd.grad(
            samattn.attention(*(t.requires_grad_() for t in (q, k, v)), causal=causal).sum(),
            (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_nan_and_inf_stay_in_their_query_row(dtype):
    # A non-finite query element poisons its own output row only; every other row is exact.
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, dtype=dtype, device="cuda", seed=5)
    q[0, 0, 3, 7] = float("nan")
    q[0, 1, 9, 0] = float("inf")
    out = samattn.attention(q, k, v)
    assert torch.isnan(out[0, 0, 3]).all() and torch.isnan(out[0, 1, 9]).all()
    keep = torch.ones(out.shape[:3], dtype=torch.bool, device="cuda")
    keep[0, 0, 3] = keep[0, 1, 9] = False
    clean = q.clone()
    clean[~keep] = 0
    ref = samattn.attention(clean, k, v)
    assert torch.equal(out[keep], ref[keep])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_large_magnitudes_do_not_overflow(dtype):
    # |q.k| reaches 64 * 200^2 = 2.6e6, far beyond float16's 65504: scores must stay in fp32.
    q, k, v = make_qkv(1, 2, 2, 128, 128, 64, dtype=dtype, device="cuda", seed=6)
    q, k = (q * 200).clamp(-60000, 60000), (k * 200).clamp(-60000, 60000)
    out = run_poisoned(q, k, v)
    assert torch.isfinite(out).all()
    check_forward(out, q, k, v, samattn.selected_backend(q, k, v))


@pytest.mark.serial  # ~40 GB of device memory: alone, or parallel workers run out of memory
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_tensor_beyond_2_31_elements(dtype):
    # q and out hold 2^31 + 2^20 elements (int32 offsets would wrap): every element is checked,
    # chunk by chunk, against the float64 formula.
    heads, seqlen_q, head_dim = 1, (2**31 + 2**20) // 128, 128
    gen = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(1, heads, seqlen_q, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(1, heads, 96, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(1, heads, 96, head_dim, device="cuda", dtype=dtype, generator=gen)
    assert q.numel() > 2**31
    out = run_poisoned(q, k, v)
    used = samattn.selected_backend(q, k, v)
    rows = 2**22
    for start in range(0, seqlen_q, rows):
        part = q[:, :, start:start + rows]
        check_forward(out[:, :, start:start + rows], part, k, v, used)
    del q, out
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Streams, graphs, synchronisation.

def test_forward_and_backward_run_on_a_side_stream_without_host_sync():
    q, k, v = make_qkv(2, 4, 2, 300, 300, 64, dtype=torch.bfloat16, device="cuda", seed=8)
    dout = torch.randn(q.shape, device="cuda").to(q.dtype)
    leaf = q.detach().requires_grad_()
    expected_out = samattn.attention(leaf, k, v, causal=True)
    (expected_dq,) = torch.autograd.grad(expected_out, (leaf,), dout)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
    try:
        with torch.cuda.stream(stream):
            leaf = q.detach().requires_grad_()
            out = samattn.attention(leaf, k, v, causal=True)
            (dq,) = torch.autograd.grad(out, (leaf,), dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.equal(out, expected_out.detach())
    assert torch.equal(dq, expected_dq)


# ---------------------------------------------------------------------------------------------
# Memory.

def _host_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


@pytest.mark.serial  # device-wide free memory: no other test process may share the GPU
def test_ten_thousand_calls_leave_memory_flat():
    q, k, v = make_qkv(2, 4, 2, 128, 128, 64, dtype=torch.float16, device="cuda", seed=9)
    qg = q.detach().requires_grad_()

    def step():
        out = samattn.attention(qg, k, v, causal=True)
        (dq,) = torch.autograd.grad(out.sum(), (qg,))
        return dq

    for _ in range(50):  # warm-up: allocator pools, lazy module loads, caches
        step()
    torch.cuda.synchronize()
    gc.collect()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    free = torch.cuda.mem_get_info()[0]
    rss = _host_rss_bytes()
    for _ in range(10_000):
        step()
    torch.cuda.synchronize()
    gc.collect()
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory_reserved() == reserved, "torch's cache grew"
    # Device memory outside torch's allocator (cudaMalloc by the library) would show here.
    assert abs(torch.cuda.mem_get_info()[0] - free) <= 2 * 2**20
    assert _host_rss_bytes() - rss <= 16 * 2**20, "host memory grew over 10,000 calls"


def test_peak_memory_is_outputs_plus_linear_workspace():
    batch, heads, seqlen, dim = 2, 8, 2048, 128
    q, k, v = make_qkv(batch, heads, heads, seqlen, seqlen, dim, dtype=torch.bfloat16,
                       device="cuda", seed=10)
    element = q.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, lse = samattn.attention(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    outputs = out.numel() * element + lse.numel() * 4
    assert torch.cuda.max_memory_allocated() - base <= outputs + 2 * 2**20
    dout = torch.randn_like(out)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, False, 1, False)
    torch.cuda.synchronize()
    gradients = sum(g.numel() * element for g in grads)
    # Workspace: O(B·H·S) row statistics plus at most one float32 (B, H, S, D) accumulator —
    # never an S x S buffer (that would be 2 * 8 * 2048^2 * 4 bytes = 256 MiB here).
    workspace = batch * heads * seqlen * (4 * dim + 16)
    assert torch.cuda.max_memory_allocated() - base <= gradients + workspace + 2 * 2**20


# ---------------------------------------------------------------------------------------------
# Determinism.

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_forward_is_bit_identical_across_runs(dtype):
    q, k, v = make_qkv(2, 8, 2, 333, 517, 64, dtype=dtype, device="cuda", seed=11)
    first = samattn.attention(q, k, v, causal=True, return_lse=True)
    for _ in range(3):
        again = samattn.attention(q, k, v, causal=True, return_lse=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_deterministic_backward_is_bit_identical(dtype):
    q, k, v = make_qkv(2, 8, 2, 333, 517, 64, dtype=dtype, device="cuda", seed=12)
    out, lse = samattn.attention(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    first = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, True, 1, True)
    for _ in range(3):
        again = samattn.ops.attention_backward(dout, q, k, v, out, lse, None, True, 1, True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# ---------------------------------------------------------------------------------------------
# Regressions found by the fuzzer (kept as fixed cases).

def test_regression_fp32_large_logits_head_dim_256():
    # Fuzz case of the 6905c2d H100 run: scale 1.0 at head dim 256 gives logits near 60, whose
    # exp carries u * |logit| relative error; the check must model it (score_error_floor).
    q, k, v = make_qkv(1, 3, 3, 151, 276, 256, dtype=torch.float32, device="cuda", seed=150)
    options = dict(causal=False, kv_stride=7, scale=1.0)
    out = run_poisoned(q, k, v, "auto", **options)
    check_forward(out, q, k, v, samattn.selected_backend(q, k, v, kv_stride=7), **options)
