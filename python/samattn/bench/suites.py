"""The benchmark suites: which configurations, against which methods."""

from __future__ import annotations

from typing import List, Tuple

from samattn.bench.configs import AttentionConfig

TOKENS = 16384  # B * S held fixed, as in the FlashAttention papers
HEADS = 16

DENSE_METHODS = ["samattn", "samattn-simt", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex"]
STRIDED_METHODS = ["samattn", "samattn-simt", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient",
                   "sdpa-math", "flex", "torch-unfused", "naive-loop"]
SMALL_METHODS = ["samattn", "sdpa-default", "torch-unfused", "samattn-unfused"]
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]

# Seed 000's course configuration and seed 001's small shapes.
SEED_000 = AttentionConfig(16, 8, 1024, 64, dtype="fp32", kv_stride=4)
SEED_001_SHAPES = [(2, 8, 64, 64), (4, 12, 128, 64), (2, 16, 256, 64), (2, 8, 77, 64)]


def _dense(dtypes, head_dims, seqlens, directions=("fwd", "bwd")) -> List[AttentionConfig]:
    return [AttentionConfig(TOKENS // s, HEADS, s, d, dtype=dt, causal=c, direction=direction)
            for dt in dtypes for d in head_dims for s in seqlens for c in (False, True)
            for direction in directions]


def attention(quick: bool):
    """Dense and causal attention, forward and backward. FlexAttention compiles one kernel per
    shape and direction (seconds each), so it runs on the bf16 head-dim-128 sweep; the other
    competitors run everywhere. samattn's SIMT path is timed in the strided and default suites."""
    fast = ["samattn", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
    if quick:
        return _dense(["bf16"], [128], [1024, 4096]), DENSE_METHODS
    return [(_dense(["bf16"], [128], SEQLENS), fast + ["flex"]),
            (_dense(["bf16"], [64, 256], SEQLENS), fast),
            (_dense(["fp16"], [128], SEQLENS), fast),
            (_dense(["fp32"], [64, 128], [1024, 4096]), ["samattn", "sdpa-efficient",
                                                         "sdpa-math"])]


def strided(quick: bool) -> Tuple[List[AttentionConfig], List[str]]:
    configs = [SEED_000, AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4)]
    if not quick:
        configs += [AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=s)
                    for s in (1, 2, 8, 16)]
        configs += [AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4, causal=True)]
    return configs, STRIDED_METHODS


def small(quick: bool) -> Tuple[List[AttentionConfig], List[str]]:
    dtypes = ["fp16"] if quick else ["fp32", "fp16"]
    shapes = SEED_001_SHAPES[:2] if quick else SEED_001_SHAPES
    return ([AttentionConfig(b, h, s, d, dtype=dt) for dt in dtypes for b, h, s, d in shapes],
            SMALL_METHODS)


def default(quick: bool) -> Tuple[List[AttentionConfig], List[str]]:
    """A representative run that finishes in a few minutes."""
    configs = [AttentionConfig(TOKENS // s, HEADS, s, 128, dtype="bf16", causal=c)
               for s in (1024, 4096, 16384) for c in (False, True)]
    configs += [AttentionConfig(4, HEADS, 4096, 64, dtype="bf16"),
                AttentionConfig(4, HEADS, 4096, 64, dtype="fp32"),
                SEED_000, AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4)]
    configs += [AttentionConfig(4, HEADS, 4096, d, dtype=dt, causal=c, direction="bwd")
                for dt, d in (("fp32", 64), ("bf16", 128)) for c in (False, True)]
    return configs, STRIDED_METHODS


# A suite returns (configurations, method names) or a list of such groups.
SUITES = {"attention": attention, "strided": strided, "small": small, "default": default}
# "masks" and "gemm" run their own cases (samattn/bench/masks.py, samattn/bench/gemm.py),
# dispatched by __main__. PENDING: suites named but not written yet (name -> where to look).
PENDING = {}
