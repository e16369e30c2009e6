"""Host time per call of samattn's attention on tiny problems, where the launch and the Python and
dispatcher layers, not the kernel, set the time (README: "tiny calls pay more host time per call
than SDPA"). Each case makes `--calls` calls back to back and divides the wall time by their
number (on CUDA it synchronises once, after the last call: with kernels of a few microseconds
the host is the bottleneck, so this is the host's time per call); `--rounds` such rounds give the
median and the minimum. torch's SDPA on the same tensors is timed in the same process.

    python3 benchmarks/bench_host_overhead.py --device cpu --label "C++ autograd" --out F.json

On the CPU the problem is (1, 1, 1, 8) float64 (samattn runs its fp64 reference there, a few
hundred nanoseconds of arithmetic); on CUDA (1, 1, 16, 64) float16. `--out` appends this run to
the file's list of runs, so that runs of two builds (e.g. with PYTHONPATH set to another
install) can sit side by side in one file."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import torch

import samattn


def commit() -> str:
    if os.environ.get("SAMATTN_COMMIT"):
        return os.environ["SAMATTN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    name = platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), name)
    return f"{name} ({os.cpu_count()} cores)"


def per_call_us(fn, calls: int, rounds: int, sync) -> dict:
    for _ in range(max(1, calls // 10)):
        fn()
    sync()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return {"median_us": statistics.median(samples), "min_us": min(samples),
            "samples_us": samples}


def cases(device: str):
    dtype, shape = (torch.float16, (1, 1, 16, 64)) if device == "cuda" else (torch.float64,
                                                                            (1, 1, 1, 8))
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device, generator=generator)
               for _ in range(3))
    q_grad = q.clone().requires_grad_()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def inference():
        with torch.inference_mode():
            samattn.attention(q, k, v)

    return shape, dtype, {
        "samattn.attention, no input requires grad": lambda: samattn.attention(q, k, v),
        "samattn.attention under inference_mode": inference,
        "samattn.attention, q requires grad (records the node)":
            lambda: samattn.attention(q_grad, k, v),
        "samattn.attention forward + backward":
            lambda: samattn.attention(q_grad, k, v).sum().backward(),
        "samattn.scaled_dot_product_attention": lambda: samattn.scaled_dot_product_attention(
            q, k, v),
        "torch SDPA (anchor)": lambda: sdpa(q, k, v),
        "torch SDPA forward + backward (anchor)": lambda: sdpa(q_grad, k, v).sum().backward(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--label", default="", help="what this build is, e.g. its autograd")
    parser.add_argument("--out", required=True, help="JSON file; this run is appended to it")
    args = parser.parse_args(argv)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    shape, dtype, timed = cases(args.device)
    results = {name: per_call_us(fn, args.calls, args.rounds, sync) for name, fn in timed.items()}
    run = {"label": args.label, "samattn": os.path.dirname(samattn.__file__),
           "device": args.device, "machine": machine(args.device), "torch": torch.__version__,
           "commit": commit(), "date": datetime.date.today().isoformat(), "shape": list(shape),
           "dtype": str(dtype), "calls": args.calls, "rounds": args.rounds, "results": results}
    runs = []
    if os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)["runs"]
    with open(args.out, "w") as f:
        json.dump({"benchmark": "host_overhead", "runs": runs + [run]}, f, indent=1)
    width = max(map(len, results))
    print(f"{args.label or 'this build'} ({machine(args.device)}, {tuple(shape)} {dtype}):")
    for name, r in results.items():
        print(f"  {name:<{width}}  {r['median_us']:8.2f} us  (min {r['min_us']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
