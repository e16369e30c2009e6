"""The benchmark timing helpers: pooling rounds, and interleaving methods across rounds."""

import contextlib

import pytest
import torch

from helpers import requires_cuda
from samattn.bench.timing import Timing, measure_interleaved, pooled


def test_pooled_takes_the_median_min_and_max_of_every_sample():
    first = Timing(2.0, 1.0, 3.0, 3, (1.0, 2.0, 3.0))
    second = Timing(5.0, 4.0, 6.0, 2, (6.0, 4.0))
    both = pooled([first, second])
    assert (both.median_ms, both.min_ms, both.max_ms, both.reps) == (3.0, 1.0, 6.0, 5)
    assert both.samples == (1.0, 2.0, 3.0, 6.0, 4.0)


def test_pooled_refuses_timings_without_samples():
    with pytest.raises(ValueError, match="samples"):
        pooled([Timing(1.0, 1.0, 1.0, 1)])


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
    assert entered == ["a", "b"] * 3
    for timing in timings.values():
        assert timing.reps == len(timing.samples) >= 6
        assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms
