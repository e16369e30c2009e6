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
# (seqlen, direction) of the attention suite's rows that also time FlexAttention.
FLEX_POINTS = {(1024, "fwd"), (16384, "fwd"), (4096, "bwd")}

# Seed 000's course configuration and seed 001's small shapes.
SEED_000 = AttentionConfig(16, 8, 1024, 64, dtype="fp32", kv_stride=4)
SEED_001_SHAPES = [(2, 8, 64, 64), (4, 12, 128, 64), (2, 16, 256, 64), (2, 8, 77, 64)]


def _dense(dtypes, head_dims, seqlens, directions=("fwd", "bwd")) -> List[AttentionConfig]:
    return [AttentionConfig(TOKENS // s, HEADS, s, d, dtype=dt, causal=c, direction=direction)
            for dt in dtypes for d in head_dims for s in seqlens for c in (False, True)
            for direction in directions]


def attention(quick: bool):
    """Dense and causal attention, forward and backward: the bf16 head-dim-128 sweep over every
    sequence length, head dims 64 and 256 and fp16 at 1k, 4k and 16k, fp32 at 1k and 4k.
    FlexAttention compiles one kernel per shape and direction (about 10 s each), so it runs on
    the bf16 head-dim-128 rows at S = 1k and 16k forward and 4k backward. samattn's SIMT path is
    timed in the strided and default suites."""
    fast = ["samattn", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
    if quick:
        return _dense(["bf16"], [128], [1024, 4096]), DENSE_METHODS
    sweep = _dense(["bf16"], [128], SEQLENS)
    with_flex = [c for c in sweep if (c.seqlen, c.direction) in FLEX_POINTS]
    three = [1024, 4096, 16384]
    return [(with_flex, fast + ["flex"]),
            ([c for c in sweep if c not in with_flex], fast),
            (_dense(["bf16"], [64, 256], three), fast[:3]),
            (_dense(["fp16"], [128], three), fast[:3]),
            (_dense(["fp32"], [64, 128], [1024, 4096]), ["samattn", "sdpa-efficient",
                                                         "sdpa-math"])]


def strided(quick: bool):
    """Seed 000's configuration and the bf16 (4, 16, 4096, 128) stride-4 case against every
    competitor; the full run adds a stride sweep and causal without FlexAttention and the naive
    loop (a compile and a slow loop per row)."""
    headline = [SEED_000, AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4)]
    if quick:
        return headline, STRIDED_METHODS
    sweep = [AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=s) for s in (1, 2, 8, 16)]
    sweep += [AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4, causal=True)]
    return [(headline, STRIDED_METHODS),
            (sweep, [m for m in STRIDED_METHODS if m not in ("flex", "naive-loop")])]


def small(quick: bool) -> Tuple[List[AttentionConfig], List[str]]:
    dtypes = ["fp16"] if quick else ["fp32", "fp16"]
    shapes = SEED_001_SHAPES[:2] if quick else SEED_001_SHAPES
    return ([AttentionConfig(b, h, s, d, dtype=dt) for dt in dtypes for b, h, s, d in shapes],
            SMALL_METHODS)


def default(quick: bool):
    """A representative run that finishes in about three minutes on an H100/H200: FlexAttention
    (a compile per row) on the S = 4k rows, the strided case and one backward."""
    forward = [AttentionConfig(TOKENS // s, HEADS, s, 128, dtype="bf16", causal=c)
               for s in (1024, 4096, 16384) for c in (False, True)]
    forward += [AttentionConfig(4, HEADS, 4096, 64, dtype="bf16"),
                AttentionConfig(4, HEADS, 4096, 64, dtype="fp32"),
                SEED_000, AttentionConfig(4, 16, 4096, 128, dtype="bf16", kv_stride=4)]
    backward = [AttentionConfig(4, HEADS, 4096, d, dtype=dt, causal=c, direction="bwd")
                for dt, d in (("fp32", 64), ("bf16", 128)) for c in (False, True)]
    configs = forward + backward
    with_flex = [c for c in configs if c.seqlen == 4096 and c.head_dim == 128 and
                 (c.direction == "fwd" or not c.causal)]
    without = [m for m in STRIDED_METHODS if m != "flex"]
    return [(with_flex, STRIDED_METHODS), ([c for c in configs if c not in with_flex], without)]


# A suite returns (configurations, method names) or a list of such groups.
SUITES = {"attention": attention, "strided": strided, "small": small, "default": default}
# What `all` runs, in this order (the most quoted first: a time limit cuts the tail).
ALL = ["attention", "strided", "small", "masks", "gemm"]
# "masks" and "gemm" run their own cases (samattn/bench/masks.py, samattn/bench/gemm.py),
# dispatched by __main__. PENDING: suites named but not written yet (name -> where to look).
PENDING = {}
