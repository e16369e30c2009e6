"""CUDA-event timing: warm-up, inputs rotated past the L2 cache, median with min and max."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int


def l2_bytes() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size


def rotation_count(bytes_per_set: int, free_bytes: int) -> int:
    """How many input sets to cycle through so consecutive calls do not hit in L2: enough to
    cover twice the L2 size, bounded by memory and a small maximum."""
    wanted = max(1, -(-2 * l2_bytes() // max(bytes_per_set, 1)))
    affordable = max(1, free_bytes // (4 * max(bytes_per_set, 1)))
    return int(min(wanted, affordable, 8))


def measure(calls: Sequence[Callable[[], object]], *, min_reps: int = 10, max_reps: int = 100,
            budget_ms: float = 400.0, warmup_ms: float = 25.0) -> Timing:
    """Times calls[i % len(calls)] one at a time with CUDA events.

    Each element of `calls` runs the same computation on a different input set. Runs until
    `budget_ms` of measured time or `max_reps`, and at least `min_reps` times.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    warm = 0
    while True:
        calls[warm % len(calls)]()
        warm += 1
        end.record()
        end.synchronize()
        if warm >= 3 and start.elapsed_time(end) >= warmup_ms:
            break
    times = []
    total = 0.0
    while len(times) < min_reps or (len(times) < max_reps and total < budget_ms):
        call = calls[len(times) % len(calls)]
        start.record()
        call()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
        times.append(elapsed)
        total += elapsed
    return Timing(statistics.median(times), min(times), max(times), len(times))


def peak_memory_bytes(call: Callable[[], object]) -> int:
    """Extra device memory one call allocates at its peak, beyond what was already allocated."""
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline
    del result
    return int(peak)


def host_latency(call: Callable[[], object], *, reps: int = 200, warmup: int = 20) -> Timing:
    """Wall-clock time per call of back-to-back calls from Python, synchronising only at the
    end: what a launch-bound caller sees (host overhead included)."""
    import time

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        begin = time.perf_counter()
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - begin) * 1e3 / reps)
    return Timing(statistics.median(samples), min(samples), max(samples), 5 * reps)
