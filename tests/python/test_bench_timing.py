"""The benchmark timing helpers: pooling rounds, interleaving methods across rounds, and a
tuning variable set for one method's measurements."""

import collections
import contextlib
import itertools
import os

import pytest
import torch

from helpers import requires_cuda
from samattn.bench.timing import (CLOCK_PROBE_CYCLES, Timing, clock_from_probe,
                                  environment_variable, measure, measure_interleaved, pooled,
                                  round_order, settle, whole_rotation_rounds)


def test_pooled_takes_the_median_min_and_max_of_every_sample():
    first = Timing(2.0, 1.0, 3.0, 3, (1.0, 2.0, 3.0))
    second = Timing(5.0, 4.0, 6.0, 2, (6.0, 4.0))
    both = pooled([first, second])
    assert (both.median_ms, both.min_ms, both.max_ms, both.reps) == (3.0, 1.0, 6.0, 5)
    assert both.samples == (1.0, 2.0, 3.0, 6.0, 4.0)


def test_environment_variable_sets_or_unsets_and_restores(monkeypatch):
    name = "SAMATTN_TEST_TUNING_VARIABLE"
    monkeypatch.setenv(name, "outer")
    with environment_variable(name, ""):  # empty: the library's default, unset
        assert name not in os.environ
    assert os.environ[name] == "outer"
    with environment_variable(name, "3"):
        assert os.environ[name] == "3"
    assert os.environ[name] == "outer"
    monkeypatch.delenv(name)
    with pytest.raises(RuntimeError):
        with environment_variable(name, "1"):
            assert os.environ[name] == "1"
            raise RuntimeError("a failed measurement")
    assert name not in os.environ


def test_pooled_refuses_timings_without_samples():
    with pytest.raises(ValueError, match="samples"):
        pooled([Timing(1.0, 1.0, 1.0, 1)])


def test_round_order_alternates_direction_and_rotates_every_two_rounds():
    orders = [round_order(["a", "b", "c"], r) for r in range(6)]
    assert orders[:4] == [["a", "b", "c"], ["c", "b", "a"], ["b", "c", "a"], ["a", "c", "b"]]
    assert sorted(map(tuple, orders)) == sorted(itertools.permutations("abc"))
    assert [round_order(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["b", "a"]]
    assert round_order([], 2) == []


def test_whole_rotations_give_every_method_every_place_and_one_double_turn():
    for count in range(1, 7):
        names = [chr(ord("a") + i) for i in range(count)]
        for wanted in (1, 3, 2 * count + 1):
            rounds = whole_rotation_rounds(count, wanted)
            assert rounds >= wanted
            orders = [round_order(names, r) for r in range(rounds)]
            places = collections.Counter((name, order.index(name)) for order in orders
                                         for name in order)
            assert len(set(places.values())) == 1 and len(places) == count * count
            doubles = collections.Counter(a[-1] for a, b in zip(orders, orders[1:])
                                          if a[-1] == b[0])
            if count > 1:
                assert all(doubles[name] * 2 * count == rounds for name in names), doubles
    assert whole_rotation_rounds(1, 1) == 1 and whole_rotation_rounds(4, 4) == 8


@requires_cuda
def test_settle_runs_every_method_in_turn_for_the_gpu_time_asked():
    x = torch.randn(512, 512, device="cuda")
    counts = collections.Counter()

    def call(name):
        counts[name] += 1
        return x @ x

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    settle({"a": [lambda: call("a")], "b": [lambda: call("b")]}, settle_ms=20.0)
    end.record()
    end.synchronize()
    assert counts["a"] == counts["b"] >= 1
    assert start.elapsed_time(end) >= 20.0


@requires_cuda
def test_measure_interleaved_alternates_methods_round_by_round():
    x = torch.randn(256, 256, device="cuda")
    entered = []

    @contextlib.contextmanager
    def around(name):
        entered.append(name)
        yield

    timings = measure_interleaved({"a": [lambda: x @ x], "b": [lambda: x + x]}, rounds=3,
                                  min_reps=6, budget_ms=3.0, around=around)
    assert entered == ["a", "b", "b", "a", "b", "a", "a", "b"]  # 3 rounds up to a rotation
    for timing in timings.values():
        assert timing.reps == len(timing.samples) >= 6
        assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms


def test_clock_from_probe_is_cycles_over_time_and_pooled_keeps_every_reading():
    assert clock_from_probe(0.02, cycles=40_000) == pytest.approx(2000.0)
    assert clock_from_probe(0.025, cycles=40_000) == pytest.approx(1600.0)
    a = Timing(1.0, 1.0, 1.0, 1, (1.0,), (1900.0, 1700.0))
    b = Timing(2.0, 2.0, 2.0, 1, (2.0,), (1800.0,))
    both = pooled([a, b])
    assert both.clocks_mhz == (1900.0, 1700.0, 1800.0)
    assert both.clock_mhz == 1800.0
    assert pooled([Timing(1.0, 1.0, 1.0, 1, (1.0,))]).clock_mhz is None


# Serial: the probe reads wall time, which the other pytest workers' kernels share (in
# e0804df's parallel lane it read 71, 1201 and 1374 MHz).
@requires_cuda
@pytest.mark.serial
def test_clock_probe_reads_one_plausible_clock_per_probed_rep():
    x = torch.randn(512, 512, device="cuda")
    plain = measure([lambda: x @ x], min_reps=8, max_reps=8, budget_ms=1.0)
    probed = measure([lambda: x @ x], min_reps=8, max_reps=8, budget_ms=1.0, probe_every=3)
    assert plain.clocks_mhz == () and plain.clock_mhz is None
    assert probed.reps == 8 and len(probed.clocks_mhz) == 3  # after reps 0, 3 and 6
    max_mhz = torch.cuda.get_device_properties(0).clock_rate / 1e3  # kHz -> MHz
    # Events add their own time to the probe, so a reading is a little under the true clock.
    assert all(100.0 < c <= 1.05 * max_mhz for c in probed.clocks_mhz), (
        probed.clocks_mhz, max_mhz, CLOCK_PROBE_CYCLES)
