"""benchmarks/schedule_model.py, the CPU model of the Hopper forward's persistent schedule: its
units cover every tile's cost once, with and without the tail of single tiles, and the tail
takes the last round's idle time where pairs leave it (head dim 64 causal, S = 16k). CPU only."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "schedule_model", os.path.join(ROOT, "benchmarks", "schedule_model.py"))
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


@pytest.mark.parametrize("seqlen,block_m", [(512, 128), (1000, 128), (16384, 192), (300, 192)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tail_units", [0, 3, 264, 1 << 20])
def test_units_cover_every_tile_once(seqlen, block_m, causal, tail_units):
    cost = model.head_tiles(seqlen, seqlen, block_m, 128, causal, 1.5)
    units = model.units(7, cost, causal, tail_units)
    assert sum(units) == pytest.approx(7 * sum(cost))
    if not causal or tail_units == 0:
        assert len(units) == 7 * (len(cost) if not causal or len(cost) == 1
                                  else (len(cost) + 1) // 2)


def test_the_tail_of_single_tiles_fills_the_last_round():
    cost = model.head_tiles(16384, 16384, 192, 128, True, 1.5)
    r = model.schedules(16, cost, True, 132)
    assert r["units"] == 688
    assert r["current"] > 1.10  # 688 pairs on 132 SMs: 5.2 rounds take 6
    assert r["tail singles"] < 1.02
    assert r["split tail"] == pytest.approx(1.0, abs=1e-3)
