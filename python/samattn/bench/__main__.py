"""python -m samattn.bench [suite ...] [--quick] [--out DIR]

Side-by-side benchmarks of samattn against torch SDPA's backends, FlexAttention and naive
PyTorch, each output checked against an fp64 reference before it is timed, and samattn.gemm
against torch.matmul (cuBLAS). Prints a table and writes JSON, CSV and PNG plots into --out.
Suites: default, attention, strided, small, masks, gemm, all.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from samattn.bench import report
from samattn.bench.methods import all_methods
from samattn.bench.runner import run_config, speedups
from samattn.bench.suites import ALL, PENDING, SUITES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samattn.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    suites = list(SUITES) + ["masks", "gemm"] + list(PENDING)
    parser.add_argument("suites", nargs="*", default=["default"],
                        help=f"any of {', '.join(suites)}, all")
    parser.add_argument("--quick", action="store_true", help="fewer configurations and reps")
    parser.add_argument("--out", default="bench-results", help="output directory")
    parser.add_argument("--methods", help="comma-separated subset of methods to run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("samattn.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [n for n in args.suites if n != "all"]
    if "all" in args.suites:
        names = [n for n in ALL if n not in names] + [n for n in names if n not in ALL]
    output_name = "all" if "all" in args.suites else "_".join(names)
    methods = all_methods()
    chosen = set(args.methods.split(",")) if args.methods else None
    env = report.environment()
    print(f"{env['gpu']} ({env['sms']} SMs), torch {env['torch']}, CUDA {env['cuda']}, "
          f"samattn {env['samattn']} ({env['commit']})")
    rows = []
    for name in names:
        if name in PENDING:
            print(f"suite {name}: n/a ({PENDING[name]})")
            continue
        if name in ("masks", "gemm"):
            from samattn.bench import gemm, masks

            def case_progress(row):
                status = f"{row['ms']:.3f} ms" if row.get("status") == "ok" else row["status"]
                print(f"{row['label']}  {row['method']}: {status}", flush=True)

            suite = masks if name == "masks" else gemm
            suite_rows = suite.run(args.quick, case_progress)
            for row in suite_rows:
                row["suite"] = name
            rows += suite_rows
            report.write(rows, env, args.out, output_name, plots=False)
            continue
        if name not in SUITES:
            parser.error(f"unknown suite {name!r}")
        groups = SUITES[name](args.quick)
        groups = groups if isinstance(groups, list) else [groups]
        groups = [(configs, [methods[m] for m in names_ if chosen is None or m in chosen])
                  for configs, names_ in groups]
        total = sum(len(configs) * len(selected) for configs, selected in groups)
        done = 0
        started = time.time()

        def progress(cfg, row):
            nonlocal done
            done += 1
            bar = "#" * (30 * done // total)
            status = f"{row['ms']:.3f} ms" if row.get("status") == "ok" else row["status"]
            print(f"[{bar:<30}] {done}/{total} {time.time() - started:5.0f}s  {cfg.label()}  "
                  f"{row['method']}: {status}", flush=True)

        for configs, selected in groups:
            for cfg in configs:
                suite_rows = run_config(cfg, selected, quick=args.quick,
                                        latency=name == "small", progress=progress)
                for row in suite_rows:
                    row["suite"] = name
                rows += suite_rows
        # A checkpoint after every suite: a run stopped by a time limit keeps what it measured.
        report.write(rows, env, args.out, output_name, plots=False)
    speedups(rows)
    report.print_table(rows)
    if "masks" in names:
        from samattn.bench import masks

        print("\nissue #6 targets:")
        for line in masks.summary([r for r in rows if r.get("suite") == "masks"]):
            print("  " + line)
    paths = report.write(rows, env, args.out, output_name)
    print("\nwrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
