"""Printing, JSON/CSV files and plots of benchmark rows."""

from __future__ import annotations

import csv
import datetime
import json
import os
import subprocess
from typing import List

import torch

import samattn


def environment() -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    commit = os.environ.get("SAMATTN_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=os.path.dirname(__file__),
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": props.name, "sms": props.multi_processor_count,
            "l2_bytes": props.L2_cache_size, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "triton": triton_version, "samattn": samattn.__version__, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "flop_formula": "fwd 4*B*H*(visible query-key pairs)*D (halved by causal); "
                            "bwd 2.5x fwd"}


def format_row(row: dict) -> str:
    if row.get("status") != "ok":
        extra = f" rel_err {row['rel_error']:.1e}" if "rel_error" in row else ""
        return f"| {row['method']:<16} | {row.get('status')}{extra}"
    speed = ", ".join(f"{k[len('speedup_vs_'):]} {v:.2f}x" for k, v in row.items()
                      if k.startswith("speedup_vs_"))
    return (f"| {row['method']:<16} | {row['ms']:9.3f} ms | {row['tflops']:7.1f} TFLOPS "
            f"| {row['peak_mem_mb']:8.1f} MB | {speed}")


def print_table(rows: List[dict]) -> None:
    last = None
    for row in rows:
        label = row["label"]
        if label != last:
            print(f"\n{label}")
            last = label
        print(format_row(row))


def write(rows: List[dict], env: dict, out_dir: str, name: str, plots: bool = True) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    paths.append(json_path)
    csv_path = os.path.join(out_dir, f"{name}.csv")
    keys = sorted({k for row in rows for k in row})
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(env) + keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({**env, **row})
    paths.append(csv_path)
    if plots:
        paths += plot(rows, env, out_dir, name)
        paths += plot_speedups(rows, env, out_dir, name)
    return paths


def plot(rows: List[dict], env: dict, out_dir: str, name: str) -> List[str]:
    """TFLOPS against sequence length per method, one panel per (dtype, head dim, causal,
    direction); skipped when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    groups = {}
    for row in rows:
        # Latency rows (small shapes, host time) are not comparable with device-time rows; the
        # strided suite's stride sweep (kv_stride 1 included) is a sweep over strides, not lengths.
        if (row.get("status") == "ok" and row.get("kv_stride") == 1 and "mask" not in row
                and row.get("timing") != "host latency" and row.get("suite") != "strided"):
            key = (row["dtype"], row["head_dim"], row["causal"], row["direction"])
            groups.setdefault(key, []).append(row)
    groups = {k: v for k, v in groups.items() if len({r["seqlen"] for r in v}) > 1}
    if not groups:
        return []
    cols = min(3, len(groups))
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    methods = sorted({r["method"] for group in groups.values() for r in group})
    palette = plt.get_cmap("tab10")
    color = {m: palette(i % 10) for i, m in enumerate(methods)}  # one colour per method
    for ax, (key, group) in zip(axes.flat, sorted(groups.items())):
        for method in sorted({r["method"] for r in group}):
            points = sorted((r["seqlen"], r["tflops"]) for r in group if r["method"] == method)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method,
                    color=color[method], linewidth=2.5 if method.startswith("samattn") else 1.2)
        dtype, head_dim, causal, direction = key
        ax.set_title(f"{dtype} D={head_dim} {'causal' if causal else 'dense'} {direction}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (B*S = 16k)")
        ax.set_ylabel("TFLOPS")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle(f"{env['gpu']}, torch {env['torch']}, samattn {env['commit']}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))  # room for the suptitle
    path = os.path.join(out_dir, f"{name}_tflops.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


# Competitors shown in the speedup bars, in this order, when a configuration has them.
SPEEDUP_COMPETITORS = ["sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "sdpa-default",
                       "flex", "torch-unfused", "torch-matmul"]


def plot_speedups(rows: List[dict], env: dict, out_dir: str, name: str) -> List[str]:
    """Horizontal bars: samattn's speedup (competitor time / samattn time, log scale, 1 = tie)
    against each competitor, one group of bars per configuration; skipped when matplotlib is
    missing or no configuration has a competitor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ours = [r for r in rows if r["method"] == "samattn" and r.get("status") == "ok"
            and r.get("timing") != "host latency"]
    shown = [c for c in SPEEDUP_COMPETITORS if any(f"speedup_vs_{c}" in r for r in ours)]
    ours = [r for r in ours if any(f"speedup_vs_{c}" in r for c in shown)]
    if not ours:
        return []
    height = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.28 * len(ours) * max(1, len(shown) / 2)))
    palette = plt.get_cmap("tab10")
    for i, competitor in enumerate(shown):
        values = [r.get(f"speedup_vs_{competitor}", float("nan")) for r in ours]
        ax.barh([y + i * height for y in range(len(ours))], values, height=height,
                label=f"vs {competitor}", color=palette(i % 10))
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    labels = [r["label"] + (f" [{r['mask']}]" if r.get("mask") else "") for r in ours]
    ax.set_yticks([y + height * (len(shown) - 1) / 2 for y in range(len(ours))])
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("samattn speedup (competitor time / samattn time; > 1: samattn faster)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{env['gpu']}, torch {env['torch']}, samattn {env['commit']}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}_speedups.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
