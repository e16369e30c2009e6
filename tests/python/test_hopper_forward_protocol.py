"""The Hopper forward's block protocol, modelled (tests/emulation/hopper_forward_pipeline.py):
random interleavings of the producer and the consumer warpgroups over random tiles must never
deadlock, with one or two Q buffers and the Q copied before or after each tile's first K
(ForwardTile::early_q); staging O in the only Q buffer, which the kernel never does, must
deadlock (the model can find one). CPU only."""

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


@pytest.mark.parametrize("q_buffers", [1, 2])
@pytest.mark.parametrize("early_q", [False, True])
def test_tile_loop_never_deadlocks(q_buffers, early_q):
    assert model.count_deadlocks(SCHEDULES, seed=q_buffers + 2 * early_q, early_q=early_q,
                                 q_buffers=q_buffers) == 0


def test_the_model_finds_the_deadlock_of_staging_in_the_only_q_buffer():
    """O staged in the Q buffer is released after the next tile's first block; with one buffer
    that next tile's Q (or the end marker) waits for it: kCanStageO asks for two."""
    assert model.count_deadlocks(SCHEDULES, seed=7, q_buffers=1, stage_o=True) > 0


@pytest.mark.parametrize("early_q", [False, True])
def test_rows_past_the_sequence_end(early_q):
    """Sq = 129 at head dim 128: the second tile's upper warpgroup has rows 192-255, past the
    end, and passes on both key blocks, as many as there are stages."""
    tiles = [model.Tile(2, [2, 2]), model.Tile(2, [2, 0])]
    rng = random.Random(4)
    assert all(model.run(tiles, 2, 2, 2, rng, early_q) is None for _ in range(200))
