"""Hopper forward benchmark: samattn's sm_90a path (backend="hopper") and sm80 path
(backend="tensor_core") against torch SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION backends,
in one process, bf16 by default.

In a build configured with -DSAMATTN_HOPPER_TUNING=ON, also the Hopper path's alternative tile
variants (SAMATTN_HOPPER_TILE=1, 2: entries of forward_config.h's tile tables, TILE_LEGEND)
at head dims 64, 96, 128 and 192, so one run compares them; without that build those columns are
left out. With --ablations, also the Hopper path with its ping-pong, its output store through shared
memory, its work-counter schedule or its narrow first block switched off
(SAMATTN_HOPPER_ABLATION), to measure what each is worth.

Shapes (B, 16, S, D) with B * S = 16384 tokens, S in {512, 1k, 2k, 4k, 8k, 16k} (--seqlens), D in
{64, 128}, causal and not, plus (2, 16, 4096, 256), (4, 16, 4096, 96) and (2, 16, 4096, 192)
(--head-dims keeps only some); the strided configuration (4, 16, 4096, 128) with kv_stride 4 against
SDPA on the `k[:, :, ::4]` view and FlexAttention with a `kv_idx % 4 == 0` mask_mod; and cuBLAS
(torch.matmul) bf16 8192^3 as the ceiling of the run. Every method's output is first compared with
SDPA flash's on the same inputs (a wrong kernel is reported, not timed). Timing: CUDA events,
warm-up, inputs rotated past the L2 cache, median of at least 10 runs and --budget-ms of measured
time per method, taken in --rounds alternating rounds over the shape's methods so that clock drift
during the run falls on all of them (samattn.bench.timing.measure_interleaved).

    python3 benchmarks/bench_hopper_forward.py --out $OUT/hopper_forward.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import samattn
from samattn.bench.configs import DTYPES, AttentionConfig
from samattn.bench.timing import measure, measure_interleaved, rotation_count

TOKENS = 16384
HEADS = 16
# Relative max-abs difference to SDPA flash above which a method's output is called wrong
# (bf16 outputs differ by a few units of 2^-8 between correct kernels).
WRONG_ABOVE = 2e-2


# The batch of the single-length rows of head dims 256, 96 and 192 (S = 4096).
BATCH_AT_4K = {96: 4, 192: 2, 256: 2}


def configs(dtype: str, seqlens, head_dims=None):
    """The rows: head dims 64 and 128 at every seqlen, 256, 96 and 192 at 4k; only those in
    head_dims where given."""
    wanted = (lambda d: True) if head_dims is None else (lambda d: d in head_dims)
    rows = []
    for seqlen in seqlens:
        for head_dim in filter(wanted, (64, 128)):
            for causal in (False, True):
                rows.append(AttentionConfig(TOKENS // seqlen, HEADS, seqlen, head_dim, dtype,
                                            causal))
    for head_dim in filter(wanted, (256, 96, 192)):
        for causal in (False, True):
            rows.append(AttentionConfig(BATCH_AT_4K[head_dim], HEADS, 4096, head_dim, dtype,
                                        causal))
    return rows


def sdpa(kernel):
    def run(q, k, v, causal):
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def samattn_backend(backend):
    def run(q, k, v, causal):
        return samattn.attention(q, k, v, causal=causal, backend=backend)

    return run


# The tuning build's other entries of a head dim's tile table (SAMATTN_HOPPER_TILE).
TILE_VARIANTS = (1, 2)
# SAMATTN_HOPPER_ABLATION values this script can time beside the default, and their columns;
# "control" is the default path again under another name (no variable): its column is the
# spread between two identical kernels, the null against which an ablation's ratio is read.
CONTROL = "control"
# "entry0" is entry 0 of the head dim's table forced (SAMATTN_HOPPER_TILE=0, in every build):
# where a shape rule picks another entry (forward_config.h's tile_variant_for_shape) its column
# tests that rule; elsewhere it is the default kernel again.
ENTRY0 = "entry0"
# "entry1" is head dim 64's entry 1 forced (its short causal tile, in every build); it has no
# column at other head dims, where only tuning builds compile entry 1.
ENTRY1 = "entry1"
# Columns that exist only at some head dims (the rest at every one).
COLUMN_HEAD_DIMS = {ENTRY1: (64,)}
ABLATION_COLUMNS = {"no_pingpong": "-pp", "no_staged_store": "-ss", "static_schedule": "-dyn",
                    "wide_first_block": "-nb", "no_lookahead": "-la", "paired_tail": "-pt",
                    "partial_last_tile": "-plt",
                    CONTROL: "-aa", ENTRY0: "-e0", ENTRY1: "-e1"}
# The variables each of those columns runs under (an ablation: SAMATTN_HOPPER_ABLATION=name).
ABLATION_ENVIRONMENT = {**{a: {"SAMATTN_HOPPER_ABLATION": a} for a in ABLATION_COLUMNS},
                        CONTROL: {}, ENTRY0: {"SAMATTN_HOPPER_TILE": "0"},
                        ENTRY1: {"SAMATTN_HOPPER_TILE": "1"}}
TILE_METHODS = tuple(f"samattn-hopper-tile{t}" for t in TILE_VARIANTS)
ABLATION_METHODS = tuple(f"samattn-hopper-{a}" for a in ABLATION_COLUMNS)
METHODS = {
    "samattn-hopper": samattn_backend("hopper"),
    "samattn-tensor_core": samattn_backend("tensor_core"),
    "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    **{name: samattn_backend("hopper") for name in TILE_METHODS + ABLATION_METHODS},
}
# Environment set around a method's whole measurement (the launcher reads both variables on
# every call). SAMATTN_HOPPER_ABLATION: the Hopper path with a feature switched off.
# SAMATTN_HOPPER_TILE: another entry of the head dim's tile table (tuning builds, head dims 64
# and 128).
ENVIRONMENT = {
    **{f"samattn-hopper-tile{t}": {"SAMATTN_HOPPER_TILE": str(t)} for t in TILE_VARIANTS},
    **{f"samattn-hopper-{a}": env for a, env in ABLATION_ENVIRONMENT.items()},
}
# What the tile entries are (forward_config.h's kTiles64 / kTiles96 / kTiles128 / kTiles192;
# M x N x stages, Q buffers; "one copy": ForwardTile::one_softmax_copy).
TILE_LEGEND = {
    64: ("192x128 (3 consumer warpgroups) 3 stages 2 Q, lean tile start",
         "128x128 3 stages 2 Q, lean tile start, one copy",
         "128x128 3 stages 2 Q, lean tile start, hoisted limits, one copy"),
    96: ("128x128 2 stages 2 Q, lean tile start, one copy",
         "128x128 2 stages 2 Q, lean tile start, early Q, hoisted limits",
         "128x128 2 stages 2 Q, lean tile start, early Q"),
    128: ("128x128 2 stages 2 Q, lean tile start",
          "128x128 2 stages 2 Q, lean tile start, early Q, hoisted limits",
          "128x128 2 stages 2 Q, lean tile start, early Q"),
    192: ("128x80 2 stages 1 Q, one copy", "128x80 2 stages 2 Q, one copy",
          "128x112 2 stages 1 Q, one copy"),
}
# Which optional columns this run measures (main() decides).
OPTIONAL = {"tiles": False, "ablations": (), "sm80": True, "rounds": 3, "probe_every": 0}


def ablation_wanted(column: str, head_dim: int) -> bool:
    """Whether this run measures ablation column `column` on rows of `head_dim`."""
    return column in OPTIONAL["ablations"] and head_dim in COLUMN_HEAD_DIMS.get(column, (head_dim,))


def methods_for(cfg: AttentionConfig) -> dict:
    def wanted(name):
        if name in TILE_METHODS:
            return OPTIONAL["tiles"] and cfg.head_dim in TILE_LEGEND
        if name == "samattn-tensor_core":
            return OPTIONAL["sm80"]
        if name in ABLATION_METHODS:
            return ablation_wanted(name.removeprefix("samattn-hopper-"), cfg.head_dim)
        return True
    return {name: run for name, run in METHODS.items() if wanted(name)}


def tiles_available() -> bool:
    """Whether this build has the tile variants (configured with -DSAMATTN_HOPPER_TUNING=ON)."""
    q = torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16)
    os.environ["SAMATTN_HOPPER_TILE"] = "1"
    try:
        samattn.attention(q, q, q, backend="hopper")
        torch.cuda.synchronize()
        return True
    except Exception as error:  # the library names the missing build option
        print(f"tile variants not measured: {str(error).splitlines()[0][:160]}", flush=True)
        return False
    finally:
        os.environ.pop("SAMATTN_HOPPER_TILE", None)


def bench(cfg: AttentionConfig, min_reps: int, budget_ms: float) -> dict:
    shape = (cfg.batch, cfg.heads, cfg.seqlen, cfg.head_dim)
    dtype = cfg.torch_dtype
    bytes_per_set = 4 * cfg.batch * cfg.heads * cfg.seqlen * cfg.head_dim * dtype.itemsize
    free, _ = torch.cuda.mem_get_info()
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [tuple(torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            for _ in range(rotation_count(bytes_per_set, free // 2))]
    row = {"config": cfg.as_dict(), "label": cfg.label(), "flops": cfg.flops(),
           "input_sets": len(sets), "methods": {}}
    reference = METHODS["sdpa-flash"](*sets[0], cfg.causal).float()
    scale = reference.abs().max().item()
    timed = {}
    for name, run in methods_for(cfg).items():
        with environment(name):
            row["methods"][name] = check_method(run, sets, cfg, reference, scale)
        if "error" not in row["methods"][name]:
            timed[name] = [lambda s=s, run=run: run(*s, cfg.causal) for s in sets]
    timings = measure_interleaved(timed, rounds=OPTIONAL["rounds"], min_reps=min_reps,
                                  budget_ms=budget_ms, around=environment,
                                  probe_every=OPTIONAL["probe_every"])
    for name, timing in timings.items():
        row["methods"][name].update(timing_entry(timing, cfg))
    del sets
    torch.cuda.empty_cache()
    return row


class environment:
    """Sets method `name`'s variable (ENVIRONMENT) for the duration of a with block."""

    def __init__(self, name: str):
        self.variables = ENVIRONMENT.get(name, {})

    def __enter__(self):
        os.environ.update(self.variables)

    def __exit__(self, *exc):
        for variable in self.variables:
            os.environ.pop(variable, None)


def check_method(run, sets, cfg, reference, scale) -> dict:
    """One method's output against SDPA flash's on the first input set: its relative max
    difference, or an error (an unsupported shape or backend, or a wrong output)."""
    try:
        out = run(*sets[0], cfg.causal)
        torch.cuda.synchronize()
    except Exception as error:  # an unsupported shape or backend is reported, not fatal
        return {"error": str(error).splitlines()[0][:200]}
    diff = (out.float() - reference).abs().max().item() / max(scale, 1e-30)
    entry = {"max_rel_diff_vs_flash": diff}
    if not diff <= WRONG_ABOVE:  # NaN lands here too
        entry["error"] = f"wrong output: max |out - flash| / max|flash| = {diff:.3e}"
    return entry


def timing_entry(timing, cfg) -> dict:
    entry = dict(median_ms=timing.median_ms, min_ms=timing.min_ms, max_ms=timing.max_ms,
                 reps=timing.reps, tflops=cfg.flops() / (timing.median_ms * 1e-3) / 1e12)
    if timing.clock_mhz is not None:  # --clock-probe
        # The median time in cycles of the probed clock: two runs of one kernel that differ in
        # time only because the GPU's power management clocked them differently agree here
        # (274cf90's lone kv_stride rows: samattn's median 3.5-4.3% above its control's, its
        # clock 3.9-4.2% lower, their cycles 0.1-0.4% apart).
        entry.update(probe_clock_mhz=timing.clock_mhz, probe_clock_min_mhz=min(timing.clocks_mhz),
                     probe_clock_max_mhz=max(timing.clocks_mhz),
                     probe_kcycles=timing.median_ms * timing.clock_mhz)
    return entry


def strided(dtype: str, min_reps: int, budget_ms: float, stride: int = 4) -> dict:
    """samattn's kv_stride option against what each competitor would be given."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cfg = AttentionConfig(4, HEADS, 4096, 128, dtype, False, kv_stride=stride)
    shape = (cfg.batch, cfg.heads, cfg.seqlen, cfg.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(shape, device="cuda", dtype=cfg.torch_dtype, generator=gen)
               for _ in range(3))
    mask = create_block_mask(lambda b, h, qi, ki: ki % stride == 0, None, None, cfg.seqlen,
                             cfg.seqlen, device="cuda")
    flex = torch.compile(flex_attention, dynamic=False)
    view_k, view_v = k[:, :, ::stride], v[:, :, ::stride]

    def on_view(kernel):
        def run():
            with sdpa_kernel(kernel):
                return F.scaled_dot_product_attention(q, view_k, view_v)
        return run

    methods = {
        "samattn": lambda: samattn.attention(q, k, v, kv_stride=stride),
        **({name: lambda: samattn.attention(q, k, v, kv_stride=stride)
            for name in (f"samattn-tile{t}" for t in TILE_VARIANTS)}
           if OPTIONAL["tiles"] else {}),
        **{"samattn-" + a: lambda: samattn.attention(q, k, v, kv_stride=stride)
           for a in OPTIONAL["ablations"] if ablation_wanted(a, cfg.head_dim)},
        "sdpa-flash-view": on_view(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn-view": on_view(SDPBackend.CUDNN_ATTENTION),
        "flex-mask_mod": lambda: flex(q, k, v, block_mask=mask),
    }
    reference = methods["sdpa-flash-view"]().float()
    scale = reference.abs().max().item()
    row = {"config": cfg.as_dict(), "label": cfg.label(), "flops": cfg.flops(), "methods": {}}

    def method_environment(name):
        return environment(name.replace("samattn-", "samattn-hopper-"))

    timed = {}
    for name, run in methods.items():
        with method_environment(name):
            diff = (run().float() - reference).abs().max().item() / scale
        row["methods"][name] = {"max_rel_diff_vs_flash": diff}
        if not diff <= WRONG_ABOVE:
            row["methods"][name]["error"] = f"wrong output: {diff:.3e}"
        else:
            timed[name] = [run]
    # FlexAttention is timed on its own: its 1.7 ms calls leave the GPU's clocks higher for
    # whichever method follows them (in d15bb15's run that method read 6% faster than the same
    # kernel elsewhere in the round), and the 5x target needs no tighter comparison.
    flex_timed = {name: timed.pop(name) for name in ("flex-mask_mod",) if name in timed}
    timings = measure_interleaved(timed, rounds=OPTIONAL["rounds"],
                                  min_reps=min_reps, budget_ms=budget_ms,
                                  around=method_environment, probe_every=OPTIONAL["probe_every"])
    timings.update(measure_interleaved(flex_timed, rounds=1, min_reps=min_reps,
                                       budget_ms=budget_ms, probe_every=OPTIONAL["probe_every"]))
    for name, timing in timings.items():
        row["methods"][name].update(timing_entry(timing, cfg))
    return row


def cublas_tflops(dtype: torch.dtype, n: int = 8192) -> float:
    """torch.matmul (cuBLAS) n^3 in `dtype`: the tensor-core ceiling measured in this run."""
    a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
    timing = measure([lambda: a @ b], min_reps=20)
    return 2.0 * n**3 / (timing.median_ms * 1e-3) / 1e12


def commit() -> str:
    if os.environ.get("SAMATTN_COMMIT"):
        return os.environ["SAMATTN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def print_summary(result: dict) -> None:
    """One line per shape: TFLOPS of samattn's Hopper path (default tile, and the tile variants
    and ablations this run measured), cuDNN and FA2, and the ratios to cuDNN."""
    def tflops(row, name):
        return row["methods"].get(name, {}).get("tflops")

    def ratio(a, b):
        return f"{a / b:5.2f}" if a and b else "  -  "

    def cell(x):
        return f"{x:6.1f}" if x else "     -"

    tiles, ablations = OPTIONAL["tiles"], OPTIONAL["ablations"]
    print(f"\nsummary (TFLOPS; cuBLAS {result['cublas_8192_tflops']:.1f}; t0 = the default"
          " path: entry 0 (D = 192: entry 1), at D = 64 causal with S <= 512 entry 1, at D = 96"
          " and 128 with S <= 2k and kv_stride 1 entry 2"
          + ("; t1, t2 = SAMATTN_HOPPER_TILE=1, 2" if tiles else "")
          + ("; -pp, -ss, -dyn, -nb, -la, -pt: t0 over itself without ping-pong / the staged"
             " output store / the work counter / the narrow first block / the lookahead / the"
             " tail of single tiles; -aa: t0 over itself (the same kernel again); -e0: t0 over"
             " entry 0 forced"
             if ablations else "")
          + ")")
    if tiles:
        for head_dim, names in TILE_LEGEND.items():
            print(f"  D{head_dim}: " + ", ".join(f"entry {i} {n}" for i, n in enumerate(names)))
    header = f"{'shape':<36} {'t0':>6}"
    header += "".join(f" {'t' + str(t):>6}" for t in TILE_VARIANTS) if tiles else ""
    header += f" {'cudnn':>6} {'fa2':>6}  t0/cudnn"
    header += "".join(f"  t{t}/cudnn" for t in TILE_VARIANTS) if tiles else ""
    header += "  best"
    header += "   t0/fa2" + "".join(f"  /{ABLATION_COLUMNS[a]:<4}" for a in ablations)
    print(header)
    for row in result["rows"]:
        ours, cudnn, fa2 = (tflops(row, n) for n in ("samattn-hopper", "sdpa-cudnn", "sdpa-flash"))
        line = f"{row['label']:<36} {cell(ours)}"
        variants = {"t0": ours}
        if tiles:
            variants.update({f"t{t}": tflops(row, m) for t, m in zip(TILE_VARIANTS, TILE_METHODS)})
            line += "".join(f" {cell(variants[f't{t}'])}" for t in TILE_VARIANTS)
        line += f" {cell(cudnn)} {cell(fa2)}  {ratio(ours, cudnn):>8}"
        if tiles:
            line += "".join(f"  {ratio(variants[f't{t}'], cudnn):>8}" for t in TILE_VARIANTS)
        line += f"  {max(variants, key=lambda n: variants[n] or 0.0):<4}"
        line += f"  {ratio(ours, fa2):>7}"
        for a in ablations:
            line += f"  {ratio(ours, tflops(row, 'samattn-hopper-' + a))}"
        print(line)
    strided = result.get("strided")
    if strided:
        ms = {n: e.get("median_ms") for n, e in strided["methods"].items()}
        cudnn = ms.get("sdpa-cudnn-view")
        names = {"t0": "samattn"}
        if tiles:
            names.update({f"t{t}": f"samattn-tile{t}" for t in TILE_VARIANTS})
        names.update({ABLATION_COLUMNS[a]: "samattn-" + a for a in ablations})
        cells = ", ".join(
            f"{label} {ms.get(n) or float('nan'):.3f} ms ({ratio(cudnn, ms.get(n)).strip()}x"
            " cuDNN)" for label, n in names.items())
        print(f"{strided['label']}: samattn {cells}; cuDNN on the view "
              f"{cudnn or float('nan'):.3f} ms, FA2 on the view "
              f"{ms.get('sdpa-flash-view') or float('nan'):.3f} ms, Flex "
              f"{ms.get('flex-mask_mod') or float('nan'):.3f} ms")
    rows = result["rows"] + ([strided] if strided else [])
    probed = [r for r in rows if any("probe_clock_mhz" in e for e in r["methods"].values())]
    if probed:
        print("\nSM clock after the timed calls (MHz, the clock probe's median per method) and"
              " the median time in thousands of cycles at that clock:")
    for row in probed:
        print(f"{row['label']:<36} " + "  ".join(
            f"{name} {e['probe_clock_mhz']:.0f} MHz {e['probe_kcycles']:.1f} kcycles"
            for name, e in row["methods"].items() if "probe_clock_mhz" in e))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hopper_forward.json")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--min-reps", type=int, default=10)
    parser.add_argument("--budget-ms", type=float, default=400.0,
                        help="measured time per method and shape (at least --min-reps runs)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds over a shape's methods, at least (rounded up "
                             "to whole rotations: twice the methods; the budget is split)")
    parser.add_argument("--seqlens", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=None,
                        help="only the rows of these head dims (default: every row)")
    parser.add_argument("--no-sm80", action="store_true",
                        help="leave out samattn's sm80 (tensor_core) path")
    parser.add_argument("--no-tiles", action="store_true",
                        help="leave out the tile variants even where the build has them")
    parser.add_argument("--no-strided", action="store_true",
                        help="leave out the kv_stride case (FlexAttention's compile takes seconds)")
    parser.add_argument("--ablations", nargs="*", default=[],
                        choices=list(ABLATION_COLUMNS),
                        help="also the Hopper path without ping-pong / O staged through "
                             "shared memory / the work counter / the narrow first block / the "
                             "tile lookahead / the causal tail of single tiles / the short "
                             "causal tile first (partial_last_tile); control: the "
                             "default path again (an A/A column); entry0: entry 0 of the tile "
                             "table forced, against the shape rules; entry1: head dim 64's "
                             "entry 1 forced (head dim 64 rows only)")
    parser.add_argument("--clock-probe", type=int, default=0, metavar="N",
                        help="after every N-th timed call, read the SM clock with a short spin "
                             "(samattn.bench.timing's clock probe) and report each method's "
                             "median clock; a diagnosis: the spin lightens the load a little")
    args = parser.parse_args(argv)
    OPTIONAL["tiles"] = not args.no_tiles and tiles_available()
    OPTIONAL["ablations"] = tuple(args.ablations)
    OPTIONAL["sm80"] = not args.no_sm80
    OPTIONAL["rounds"] = max(1, args.rounds)
    OPTIONAL["probe_every"] = max(0, args.clock_probe)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    result = {
        "gpu": props.name, "capability": f"{props.major}.{props.minor}", "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": [],
    }
    result["cublas_8192_tflops"] = cublas_tflops(DTYPES[args.dtype])
    print(f"cuBLAS {args.dtype} 8192^3: {result['cublas_8192_tflops']:.1f} TFLOPS", flush=True)
    for cfg in configs(args.dtype, args.seqlens, args.head_dims):
        row = bench(cfg, args.min_reps, args.budget_ms)
        result["rows"].append(row)
        cells = []
        for name, entry in row["methods"].items():
            cells.append(f"{name} {entry['tflops']:6.1f}" if "tflops" in entry else
                         f"{name} ERR")
        flash = row["methods"]["sdpa-flash"].get("tflops")
        ours = row["methods"]["samattn-hopper"].get("tflops")
        ratio = f" | hopper/flash {ours / flash:.2f}x" if flash and ours else ""
        hopper_share = f" | {ours / result['cublas_8192_tflops']:.2f} of cuBLAS" if ours else ""
        print(f"{row['label']:<36} " + "  ".join(cells) + ratio + hopper_share, flush=True)
    if not args.no_strided:
        row = strided(args.dtype, args.min_reps, args.budget_ms)
        result["strided"] = row
        print(row["label"] + "  " + "  ".join(
            f"{n} {e['median_ms']:.3f} ms" if "median_ms" in e else f"{n} ERR"
            for n, e in row["methods"].items()), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_summary(result)
    checked = result["rows"] + ([result["strided"]] if "strided" in result else [])
    errors = [(r["label"], n, e["error"]) for r in checked
              for n, e in r["methods"].items() if "error" in e and n.startswith("samattn")]
    for label, name, error in errors:
        print(f"ERROR {label} {name}: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
