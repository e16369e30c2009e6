"""Varlen on the Hopper forward: the persistent grid with its work counter (the default) against
one block per work unit (SAMATTN_HOPPER_ABLATION=varlen_block_per_unit, what runs while a CUDA
graph is captured) and the persistent grid's static round robin (static_schedule), next to the
padded dense call, in alternating rounds in one process. The batch is the masks benchmark's
(samattn.bench.masks): random lengths 64..3071 packed into 16384 tokens, H = 16, D = 128, bf16,
causal.

    python3 benchmarks/bench_varlen_schedule.py --out $OUT/varlen_schedule.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch

import samattn
from samattn.bench.masks import varlen_lengths
from samattn.bench.timing import environment_variable, measure_interleaved

TOTAL, HEADS, HEAD_DIM = 16384, 16, 128


def ablation(value):
    return environment_variable("SAMATTN_HOPPER_ABLATION", value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="varlen_schedule.json")
    parser.add_argument("--budget-ms", type=float, default=300.0)
    args = parser.parse_args(argv)
    lengths = varlen_lengths(TOTAL)
    longest = max(lengths)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(TOTAL, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    padded = [torch.zeros(len(lengths), HEADS, longest, HEAD_DIM, device="cuda",
                          dtype=torch.bfloat16) for _ in range(3)]
    for b, n in enumerate(lengths):
        for dst, src in zip(padded, (q, k, v)):
            dst[b, :, :n] = src[offsets[b]:offsets[b + 1]].transpose(0, 1)

    def varlen():
        return samattn.varlen_attention(q, k, v, cu, cu, longest, longest, causal=True)

    settings = {"persistent": "", "block_per_unit": "varlen_block_per_unit",
                "persistent_static": "static_schedule"}
    outputs = {}
    for name, value in settings.items():
        with ablation(value):
            outputs[name] = varlen()
    torch.cuda.synchronize()
    identical = all(torch.equal(outputs["persistent"], out) for out in outputs.values())
    calls = {name: [varlen] for name in settings}
    calls["padded dense"] = [lambda: samattn.attention(*padded, causal=True)]
    timings = measure_interleaved(calls, rounds=3, budget_ms=args.budget_ms,
                                  around=lambda name: ablation(settings.get(name, "")))
    useful = TOTAL / (len(lengths) * longest)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    result = {
        "gpu": props.name, "commit": os.environ.get("SAMATTN_COMMIT", commit),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "lengths": lengths, "heads": HEADS, "head_dim": HEAD_DIM,
        "dtype": "bf16", "causal": True, "useful_token_fraction": useful,
        "outputs_bit_identical": identical,
        "methods": {name: {"median_ms": t.median_ms, "min_ms": t.min_ms, "max_ms": t.max_ms,
                           "reps": t.reps} for name, t in timings.items()},
    }
    dense = timings["padded dense"].median_ms
    for name in settings:
        result["methods"][name]["padded_x_useful_over_varlen"] = (
            dense * useful / timings[name].median_ms)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"varlen {len(lengths)} sequences, {TOTAL} tokens, H {HEADS}, D {HEAD_DIM}, causal; "
          f"outputs bit-identical: {identical}")
    for name, entry in result["methods"].items():
        ratio = entry.get("padded_x_useful_over_varlen")
        print(f"  {name:<18} {entry['median_ms']:.3f} ms (min {entry['min_ms']:.3f})"
              + (f", padded x useful / varlen = {ratio:.2f}" if ratio else ""))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
