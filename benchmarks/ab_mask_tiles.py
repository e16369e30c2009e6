"""The masks benchmark's samattn rows (samattn.bench.masks: bf16, B = 1, H = 16, D = 128,
S = 16k) under several Hopper forward settings in one process: the default and each
SAMATTN_HOPPER_TILE=N (a tuning entry of a -DSAMATTN_HOPPER_TUNING=ON build) and
SAMATTN_HOPPER_ABLATION=NAME given, timed in alternating rounds (measure_interleaved), each
output checked against the fp64 reference rows first. Reports, per case, each setting's time,
its ratio to the same setting's dense time scaled by the density f (issue #6's <= 1.2 target)
and setting/default.

    python3 benchmarks/ab_mask_tiles.py --tile 3 --out $OUT/ab_mask_tiles.json
    python3 benchmarks/ab_mask_tiles.py --ablation wide_first_block --out $OUT/ab_masks.json
    python3 benchmarks/ab_mask_tiles.py --control --out $OUT/ab_masks.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from samattn.bench.masks import (MaskCase, _samattn_call, cases, mask_statistics,
                                 reference_rows, relative_error, _MAX_REL_ERROR)
from samattn.bench.report import environment
from samattn.bench.timing import environment_variable, measure_interleaved

HEADS, HEAD_DIM, SEQLEN = 16, 128, 16384


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tile", action="append", default=[],
                        help="a tuning entry timed beside the default (repeatable)")
    parser.add_argument("--ablation", action="append", default=[],
                        help="a SAMATTN_HOPPER_ABLATION value timed beside the default "
                             "(repeatable)")
    parser.add_argument("--control", action="store_true",
                        help="also the default again under another name (an A/A column: the "
                             "spread two identical kernels show)")
    parser.add_argument("--out", default="ab_mask_tiles.json")
    parser.add_argument("--budget-ms", type=float, default=300.0)
    args = parser.parse_args(argv)
    # name -> the (variable, value) it runs under; the default's empty value unsets the variable.
    entries = {"default": ("SAMATTN_HOPPER_TILE", "")}
    entries.update({f"tile{t}": ("SAMATTN_HOPPER_TILE", t) for t in args.tile})
    entries.update({a: ("SAMATTN_HOPPER_ABLATION", a) for a in args.ablation})
    if args.control:
        entries["control"] = ("SAMATTN_HOPPER_TILE", "")
    if len(entries) == 1:
        parser.error("give at least one --tile, --ablation or --control")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, SEQLEN, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    dense = MaskCase("dense (no mask)", lambda b, q_, k_: q_ >= 0, {})
    result = {**environment(), "heads": HEADS, "head_dim": HEAD_DIM, "seqlen": SEQLEN,
              "dtype": "bf16", "cases": [],
              "entries": {n: f"{var}={value}" for n, (var, value) in entries.items()}}
    failed = False
    dense_ms = {}
    for case in [dense] + cases(True, SEQLEN):
        stats = {"density": 1.0} if case is dense else mask_statistics(case, SEQLEN, "cuda")
        ref = reference_rows(case, q, k, v, [0, HEADS - 1])
        row = {"case": case.name, "density": stats["density"]}
        for name, env in entries.items():
            with environment_variable(*env):
                out = _samattn_call(case, q, k, v)
                torch.cuda.synchronize()
            error = relative_error(out, ref)
            row[f"{name}_rel_error"] = error
            if not error <= _MAX_REL_ERROR:  # NaN fails too
                failed = True
            del out
        calls = {name: [lambda c=case: _samattn_call(c, q, k, v)] for name in entries}
        timings = measure_interleaved(calls, rounds=4, budget_ms=args.budget_ms,
                                      around=lambda name: environment_variable(*entries[name]))
        for name, t in timings.items():
            row[f"{name}_ms"] = t.median_ms
            if case is dense:
                dense_ms[name] = t.median_ms
            else:
                row[f"{name}_vs_density"] = t.median_ms / (stats["density"] * dense_ms[name])
        for name in entries:
            if name != "default":
                row[f"{name}_over_default"] = row[f"{name}_ms"] / row["default_ms"]
        result["cases"].append(row)
        print(f"{case.name:<48} f {stats['density']:.3f}  " + "  ".join(
            f"{n} {row[f'{n}_ms']:.3f} ms" + (f" ({row[f'{n}_vs_density']:.2f} of f x dense)"
                                              if f"{n}_vs_density" in row else "")
            + (f" = {row[f'{n}_over_default']:.3f} x default" if n != "default" else "")
            for n in entries), flush=True)
        del ref
        torch.cuda.empty_cache()
    result["all_outputs_within_tolerance"] = not failed
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"outputs within tolerance: {not failed} (bf16 relative error <= {_MAX_REL_ERROR})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
