"""The Hopper forward's block protocol, modelled (tests/emulation/hopper_forward_pipeline.py):
random interleavings of the producer and the consumer warpgroups over random tiles must never
deadlock, for the plain tile loop and for the overlapped boundary with its rule, with the Q
copied before or after each tile's first K; without the
rule the model must find the deadlock the rule is there for. CPU only."""

import importlib.util
import os
import random

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "hopper_forward_pipeline", os.path.join(ROOT, "tests", "emulation",
                                            "hopper_forward_pipeline.py"))
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)

SCHEDULES = 1000


def test_plain_loop_never_deadlocks():
    assert model.count_deadlocks(SCHEDULES, overlap=False, early_rule=True, seed=1) == 0


def test_overlapped_boundary_with_its_rule_never_deadlocks():
    assert model.count_deadlocks(SCHEDULES, overlap=True, early_rule=True, seed=2) == 0


@pytest.mark.parametrize("q_buffers", [1, 2])
def test_early_q_never_deadlocks(q_buffers):
    """ForwardTile::early_q: each tile's Q before its first K, in the plain loop (every entry)
    and, with two Q buffers, in the overlapped boundary (tuning entry 1)."""
    assert model.count_deadlocks(SCHEDULES, overlap=False, early_rule=True, seed=5,
                                 early_q=True, q_buffers=q_buffers) == 0
    if q_buffers == 2:
        assert model.count_deadlocks(SCHEDULES, overlap=True, early_rule=True, seed=6,
                                     early_q=True) == 0


def test_the_model_finds_the_deadlock_without_the_rule():
    assert model.count_deadlocks(SCHEDULES, overlap=True, early_rule=False, seed=3) > 0


def test_rows_past_the_sequence_end():
    """Sq = 129 at head dim 128: the second tile's upper warpgroup has rows 192-255, past the
    end, and passes on both key blocks, as many as there are stages."""
    tiles = [model.Tile(2, [2, 2]), model.Tile(2, [2, 0])]
    rng = random.Random(4)
    outcomes = {rule: [model.run(tiles, 2, 2, 2, True, rule, rng) for _ in range(200)]
                for rule in (True, False)}
    assert all(outcome is None for outcome in outcomes[True])
    assert any(outcome is not None for outcome in outcomes[False])
