"""The Hopper forward's block protocol, modelled (tests/emulation/hopper_forward_pipeline.py):
random interleavings of the producer and the consumer warpgroups over random tiles must never
deadlock, with one or two Q buffers, the Q copied before or after each tile's first K
(ForwardTile::early_q) and the tile lookahead (two Q buffers); staging O in the only Q buffer,
which the kernel never does, must deadlock, and so must the lookahead without the early release
of a warpgroup that computes at most one of a tile's blocks (the model can find both). CPU
only."""

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


@pytest.mark.parametrize("early_q", [False, True])
def test_the_lookahead_never_deadlocks(early_q):
    assert model.count_deadlocks(SCHEDULES, seed=11 + early_q, early_q=early_q,
                                 lookahead=True) == 0


def test_the_lookahead_needs_the_early_release():
    """S = 1050 at head dim 128: the last tile's upper warpgroup has no row and passes on all of
    its blocks; without releasing the tile before's staged buffer first, it waits for stages the
    producer issues only after the lookahead, which waits for that buffer."""
    tiles = [model.Tile(9, [9, 9]), model.Tile(9, [9, 0]), model.Tile(9, [9, 9])]
    rng = random.Random(5)
    assert all(model.run(tiles, 2, 2, 2, rng, lookahead=True) is None for _ in range(200))
    assert any(model.run(tiles, 2, 2, 2, rng, lookahead=True, early_release=False) is not None
               for _ in range(200))
    assert model.count_deadlocks(SCHEDULES, seed=13, lookahead=True, early_release=False) > 0
