"""CUDA-event timing: warm-up, inputs rotated past the L2 cache, median with min and max."""

from __future__ import annotations

import contextlib
import functools
import os
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
    samples: tuple = ()  # every rep's time (ms), in the order measured
    clocks_mhz: tuple = ()  # the clock probe's readings after the reps it followed (MHz)

    @property
    def clock_mhz(self) -> float | None:
        """The median of the clock probe's readings, or None where no probe ran."""
        return statistics.median(self.clocks_mhz) if self.clocks_mhz else None


# The clock probe: a one-thread spin of this many SM cycles (torch.cuda._sleep, which counts
# clock64) timed with CUDA events; cycles over time is the SM clock while it ran. 20-25 us at
# the H100/H200's 1.6-2.0 GHz: long against the events' own ~1 us, short against a timed call.
CLOCK_PROBE_CYCLES = 40_000


def pooled(timings: Sequence[Timing]) -> Timing:
    """One Timing from several measurements of the same calls: the median, min and max of all
    their samples together."""
    times = [t for timing in timings for t in timing.samples]
    if not times:
        raise ValueError("pooled() needs timings that kept their samples")
    clocks = tuple(c for timing in timings for c in timing.clocks_mhz)
    return Timing(statistics.median(times), min(times), max(times), len(times), tuple(times),
                  clocks)


def l2_bytes() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size


def rotation_count(bytes_per_set: int, free_bytes: int) -> int:
    """How many input sets to cycle through so consecutive calls do not hit in L2: enough to
    cover twice the L2 size, bounded by memory and a small maximum."""
    wanted = max(1, -(-2 * l2_bytes() // max(bytes_per_set, 1)))
    affordable = max(1, free_bytes // (4 * max(bytes_per_set, 1)))
    return int(min(wanted, affordable, 8))


def clock_from_probe(probe_ms: float, cycles: int = CLOCK_PROBE_CYCLES) -> float:
    """The SM clock (MHz) a probe of `cycles` cycles that took `probe_ms` ran at. The events'
    own time is in probe_ms, so this reads a little low, by the same amount for every method."""
    return cycles / (probe_ms * 1e3)


@functools.cache
def load_clock_probe(device: int) -> None:
    """Launches the probe's spin once per device and process: its first launch loads its kernel
    (lazy module loading), host time that the first probe's events would count (at e0804df a
    first reading of 71 MHz)."""
    torch.cuda._sleep(CLOCK_PROBE_CYCLES)


# A measurement's warm-up: at least this much GPU time (and 3 calls).
WARMUP_MS = 25.0


def measure(calls: Sequence[Callable[[], object]], *, min_reps: int = 10, max_reps: int = 100,
            budget_ms: float = 400.0, warmup_ms: float = WARMUP_MS,
            probe_every: int = 0) -> Timing:
    """Times calls[i % len(calls)] one at a time with CUDA events.

    Each element of `calls` runs the same computation on a different input set. The warm-up
    (at least 3 calls and `warmup_ms`) also estimates one call's time, which sets the repetition
    count: `budget_ms` of measured time, clamped to [min_reps, max_reps]. The timed calls are then
    queued back to back, each between its own pair of events, and the host synchronises once at
    the end: the host runs ahead of the GPU, so a rep's time is its kernels' time and not the
    host's launch latency after an idle GPU (which a synchronisation per rep would add, and which
    a busy host inflates by milliseconds).

    probe_every > 0: after every probe_every-th rep, outside its events, the clock probe
    (CLOCK_PROBE_CYCLES) reads the SM clock the GPU has just run that method at (a diagnosis:
    the probe's spin adds a light phase between calls, the same for every method).
    """
    if probe_every > 0:
        load_clock_probe(torch.cuda.current_device())
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    warm = 0
    while True:
        calls[warm % len(calls)]()
        warm += 1
        end.record()
        end.synchronize()
        if warm >= 3 and start.elapsed_time(end) >= warmup_ms:
            break
    per_call = start.elapsed_time(end) / warm
    reps = int(min(max_reps, max(min_reps, budget_ms // max(per_call, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    probes = []
    for i, (before, after) in enumerate(events):
        before.record()
        calls[i % len(calls)]()
        after.record()
        if probe_every > 0 and i % probe_every == 0:
            probes.append((torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True)))
            probes[-1][0].record()
            torch.cuda._sleep(CLOCK_PROBE_CYCLES)
            probes[-1][1].record()
    torch.cuda.synchronize()
    times = [before.elapsed_time(after) for before, after in events]
    clocks = tuple(clock_from_probe(begin.elapsed_time(end)) for begin, end in probes)
    return Timing(statistics.median(times), min(times), max(times), len(times), tuple(times),
                  clocks)


@contextlib.contextmanager
def environment_variable(name: str, value: str):
    """`name` set to `value` for a with block (empty: unset, the library's default), its previous
    value restored after: the library reads its tuning variables (SAMATTN_HOPPER_TILE,
    SAMATTN_HOPPER_ABLATION) on every call, so one process can time several settings
    (measure_interleaved's `around`)."""
    previous = os.environ.pop(name, None)
    if value:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if previous is not None:
            os.environ[name] = previous


def round_order(names: list, round_index: int) -> list:
    """The order of round `round_index` in measure_interleaved: round pair j (rounds 2j and
    2j + 1) runs `names` rotated left by j, forwards and then backwards (for three methods the
    six rounds are all six orders)."""
    shift = (round_index // 2) % len(names) if names else 0
    order = names[shift:] + names[:shift]
    return order[::-1] if round_index % 2 else order


# GPU time of untimed calls before the first round (settle).
SETTLE_MS = 100.0


def settle(methods: dict, settle_ms: float = SETTLE_MS) -> None:
    """Runs the methods' first calls in turn, untimed and without their environments (which only
    pick among kernels), until `settle_ms` of GPU time has passed.
    After seconds of host work (FlexAttention's compile, a CPU reference) the GPU's clocks start
    from idle and the first timed method would take their ramp. (274cf90's two kv_stride
    processes read 92 and 175 MHz once, for the method that opened the first round, and over
    1490 MHz for every other method; those single readings were the probe's first launch, which
    `measure` now makes before its events.)"""
    if not methods:
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    while True:
        for calls in methods.values():
            calls[0]()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= settle_ms:
            return


def whole_rotation_rounds(method_count: int, rounds: int) -> int:
    """`rounds` rounded up to whole rotations of round_order: 2 x method_count rounds, in which
    every method holds every place of a round twice and runs twice in a row (the last of a
    round forwards opens the next one) exactly once. With fewer, some method keeps the places
    and the double turn: in 274cf90's kv_stride rows (4 methods, 4 rounds, half a rotation)
    samattn opened two rounds, closed two and ran twice in a row; its median was 3.5-4.3% above
    the same kernel's under another name, its probed clock 3.9-4.2% lower, and their times in
    cycles of that clock 0.1-0.4% apart."""
    per_rotation = 2 * method_count if method_count > 1 else 1
    return per_rotation * -(-max(1, rounds) // per_rotation)


def measure_interleaved(methods: dict, *, rounds: int = 3, min_reps: int = 10,
                        budget_ms: float = 400.0, around=None, probe_every: int = 0) -> dict:
    """Times several methods in alternating rounds, each round `measure` with a `rounds`-th of
    the budget and of the minimum repetitions, and pools each method's samples. The GPU's clocks
    drift during a run (power, temperature); measured one after the other, the method that runs
    last would take all of the drift, measured in rounds every method takes a share of it. Each
    round runs the methods backwards after a round forwards, and each pair of rounds starts
    one method later (A B C, C B A, B C A, A C B, ...: round_order), so that no method always
    follows the same one or always opens a round; `rounds` is a minimum, rounded up to whole
    rotations (whole_rotation_rounds) so that every method takes every place equally often.
    Without the rotation, two identical kernels in one row of d15bb15's forward matrix on an
    H200 (head dim 128, S = 4k) had medians 1.14x (the one that opened every round) and 1.01x
    (the one that closed it) their fastest rep.

    `methods` maps a name to its calls (as for `measure`); `around(name)`, when given, is a
    context manager entered around each of that method's measurements (its environment);
    probe_every: as for `measure` (each method's Timing then has its clock readings).
    """
    parts = {name: [] for name in methods}
    settle(methods)
    rounds = whole_rotation_rounds(len(methods), rounds)
    for r in range(rounds):
        for name in round_order(list(methods), r):
            calls = methods[name]
            with around(name) if around else contextlib.nullcontext():
                # After the first round a method's lazy set-up is done and settle() has
                # warmed the GPU: the later rounds' warm-up is measure's minimum of 3 calls,
                # which also estimates the call's time (whole rotations have 2 x methods rounds).
                parts[name].append(measure(calls, min_reps=max(3, -(-min_reps // rounds)),
                                           budget_ms=budget_ms / rounds,
                                           warmup_ms=WARMUP_MS if r == 0 else 0.0,
                                           probe_every=probe_every))
    return {name: pooled(timings) for name, timings in parts.items()}


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
