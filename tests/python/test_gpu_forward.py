"""The CUDA forward against samattn's fp64 reference: fresh random inputs, outputs poisoned
before the run, every element checked. Skipped without a GPU."""


import pytest
import torch

import samattn
from helpers import (ALL_DTYPES, assert_close, check_against_reference, make_qkv,
                     reference_attention, requires_cuda)

pytestmark = requires_cuda

BACKENDS = ["simt", "auto"]


def run_poisoned(q, k, v, *, backend, **options):
    """Runs attention_forward_into on a NaN-filled output so an unwritten element fails."""
    out = torch.full((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), float("nan"),
                     dtype=q.dtype, device=q.device)
    samattn.ops.attention_forward_into(q, k, v, out, options.get("scale"),
                                       options.get("causal", False), options.get("kv_stride", 1),
                                       backend)
    return out


SCENARIOS = {
    "dense": dict(shape=(2, 4, 4, 77, 129, 64)),
    "causal": dict(shape=(2, 4, 4, 129, 129, 64), causal=True),
    "causal_sq_gt_sk": dict(shape=(1, 2, 2, 130, 40, 64), causal=True),
    "causal_sq_lt_sk": dict(shape=(1, 2, 2, 40, 130, 64), causal=True),
    "strided": dict(shape=(2, 4, 4, 100, 256, 64), kv_stride=4),
    "strided_causal": dict(shape=(1, 4, 4, 129, 129, 32), kv_stride=3, causal=True),
    "gqa_8to1": dict(shape=(2, 8, 1, 64, 80, 128)),
    "bshd_layout": dict(shape=(2, 4, 2, 65, 70, 64), layout="bshd"),
    "s1": dict(shape=(3, 2, 2, 1, 1, 64)),
    "s1000": dict(shape=(1, 2, 2, 1000, 1000, 64), causal=True),
    "head_dim_8": dict(shape=(1, 2, 2, 33, 33, 8)),
    "head_dim_40": dict(shape=(1, 2, 2, 33, 47, 40)),
    "head_dim_72": dict(shape=(1, 2, 2, 33, 47, 72)),
    "head_dim_80": dict(shape=(1, 2, 2, 33, 47, 80)),
    "head_dim_96": dict(shape=(1, 2, 2, 33, 47, 96)),
    "head_dim_256": dict(shape=(1, 2, 2, 70, 90, 256), causal=True),
    "value_dim_differs": dict(shape=(1, 2, 2, 20, 30, 32), head_dim_v=48),
    "scale": dict(shape=(1, 2, 2, 50, 60, 64), scale=0.05),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_forward_matches_reference(name, dtype, backend):
    sc = dict(SCENARIOS[name])
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = sc.pop("shape")
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                       sc.pop("head_dim_v", None), dtype=dtype, device="cuda",
                       layout=sc.pop("layout", "bhsd"), seed=hash(name) % 2**31)
    _, ref_lse = reference_attention(q, k, v, **sc)
    out = run_poisoned(q, k, v, backend=backend, **sc)
    check_against_reference(out, q, k, v, backend=backend, **sc)
    out2, lse = samattn.attention(q, k, v, return_lse=True, backend=backend, **sc)
    assert torch.equal(out2, out), "the allocating and the in-place op must agree bit for bit"
    assert_close(lse, ref_lse, torch.float64 if dtype == torch.float64 else torch.float32)


def hopper_skip_reason():
    """Why backend="hopper" cannot run a bf16 call here ("" when it can): it needs a compute
    capability 9.0 GPU and a build with the sm_90a kernels (which has every supported head
    dim)."""
    if torch.cuda.get_device_capability() != (9, 0):
        return "no compute capability 9.0 GPU"
    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    try:
        samattn.selected_backend(q, q, q, backend="hopper")
    except (RuntimeError, ValueError) as error:
        if "sm_90a kernels were not compiled" in str(error):
            return f"hopper backend unavailable: {error}"
        # On a 9.0 GPU with the kernels built, a plain bf16 call must be able to take Hopper: any
        # other refusal is a bug, not a reason to skip.
        raise
    return ""


# The scenarios the Hopper kernel supports (fp16/bf16, head dims 64, 96, 128, 192, 256, dv = d),
# plus shapes that stress its 128-row query tiles and 128- or 80-key stages.
HOPPER_SCENARIOS = {name: sc for name, sc in SCENARIOS.items()
                    if sc["shape"][5] in (64, 96, 128, 192, 256) and "head_dim_v" not in sc}
HOPPER_SCENARIOS.update({
    "strided3_causal_d128": dict(shape=(1, 4, 2, 300, 700, 128), kv_stride=3, causal=True),
    "sq1000_sk129_d256": dict(shape=(1, 2, 2, 1000, 129, 256)),
    "bshd_gqa_causal_d128": dict(shape=(2, 8, 2, 257, 257, 128), causal=True, layout="bshd"),
    # The persistent grid (one block per SM): more work units than blocks, causal tile pairs
    # with an odd tile count per head, GQA with kv_stride, a single tile.
    "persistent_gqa5_d128": dict(shape=(3, 50, 10, 300, 60, 128)),
    "persistent_causal_odd_stride3_d64": dict(shape=(2, 32, 32, 589, 589, 64), kv_stride=3,
                                              causal=True),
    "single_tile_d256": dict(shape=(1, 1, 1, 128, 80, 256)),
    "strided2_gqa_causal_d96": dict(shape=(1, 8, 2, 300, 300, 96), kv_stride=2, causal=True),
    "sq1000_sk129_causal_d192": dict(shape=(1, 2, 2, 1000, 129, 192), causal=True),
    "bshd_gqa_d192": dict(shape=(2, 8, 2, 257, 300, 192), layout="bshd"),
})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(HOPPER_SCENARIOS))
def test_forward_hopper_matches_reference(name, dtype):
    sc = dict(HOPPER_SCENARIOS[name])
    reason = hopper_skip_reason()
    if reason:
        pytest.skip(reason)
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = sc.pop("shape")
    q, k, v = make_qkv(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype=dtype,
                       device="cuda", layout=sc.pop("layout", "bhsd"), seed=hash(name) % 2**31)
    _, ref_lse = reference_attention(q, k, v, **sc)
    out = run_poisoned(q, k, v, backend="hopper", **sc)
    assert check_against_reference(out, q, k, v, backend="hopper", **sc) == "hopper"
    out2, lse = samattn.attention(q, k, v, return_lse=True, backend="hopper", **sc)
    assert torch.equal(out2, out), "the allocating and the in-place op must agree bit for bit"
    assert_close(lse, ref_lse, torch.float32)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_no_keys(dtype):
    q = torch.randn(2, 3, 5, 16, device="cuda", dtype=dtype)
    k = torch.randn(2, 3, 0, 16, device="cuda", dtype=dtype)
    v = torch.randn(2, 3, 0, 16, device="cuda", dtype=dtype)
    out, lse = samattn.attention(q, k, v, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


# Seed 001's properties.
SEED_001_SHAPES = [(2, 8, 64, 64), (4, 12, 128, 64), (2, 16, 256, 64), (2, 8, 77, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SEED_001_SHAPES, ids=str)
def test_seed_001_properties(shape, dtype):
    q, k, v = (torch.randn(*shape, device="cuda", dtype=dtype) for _ in range(3))
    out = samattn.fused_attention(q, k, v)
    assert out.shape == shape
    assert torch.isfinite(out).all()
    assert torch.equal(out, samattn.fused_attention(q, k, v)), "reruns must be bit-identical"
    check_against_reference(out, q, k, v)
    # Batch and head independence: a slice computed alone equals the slice of the whole.
    assert torch.equal(samattn.fused_attention(q[1:2], k[1:2], v[1:2]), out[1:2])
    assert torch.equal(samattn.fused_attention(q[:, 3:5], k[:, 3:5], v[:, 3:5]), out[:, 3:5])
    zeros = torch.zeros(*shape, device="cuda", dtype=dtype)
    assert torch.equal(samattn.fused_attention(zeros, zeros, zeros), zeros)


def test_runs_on_the_current_stream():
    q, k, v = make_qkv(2, 4, 4, 256, 256, 64, device="cuda", seed=11)
    expected = samattn.attention(q, k, v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = samattn.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


def test_cuda_graph_capture_and_replay():
    q, k, v = make_qkv(1, 4, 4, 128, 128, 64, dtype=torch.float16, device="cuda", seed=12)
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        samattn.ops.attention_forward_into(q, k, v, out)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        samattn.ops.attention_forward_into(q, k, v, out)
    for seed in (13, 14):
        fresh = make_qkv(1, 4, 4, 128, 128, 64, dtype=torch.float16, device="cuda", seed=seed)
        for dst, src in zip((q, k, v), fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(out, q, k, v)


def test_selected_backend_honours_forcing(monkeypatch):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, dtype=torch.float16, device="cuda")
    assert samattn.selected_backend(q, k, v, backend="simt") == "simt"
    monkeypatch.setenv("SAMATTN_FORCE_SIMT", "1")
    assert samattn.selected_backend(q, k, v) == "simt"
    q32, k32, v32 = (t.float() for t in (q, k, v))
    monkeypatch.delenv("SAMATTN_FORCE_SIMT")
    assert samattn.selected_backend(q32, k32, v32) == "simt", "fp32 stays IEEE by default"
