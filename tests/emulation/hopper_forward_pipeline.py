"""A model of the Hopper forward's block protocol (csrc/attention/hopper/forward_producer.cuh and
forward_consumer.cuh), to look for deadlocks without a GPU.

What it keeps of the kernel: the producer's order of copies (per tile: its first K, then its Q
once the Q buffer is free, then that first V, then K, V of each further block; with
ForwardTile::early_q the Q before the first K; with the tile lookahead,
ForwardKernelOptions::tile_lookahead, a tile of at least kStages + 2 blocks issues the next
tile's Q after the K of its second-to-last block, and the next tile then has its Q), the kStages-deep K and V rings (a copy waits
until every consumer warpgroup has released the stage's previous load), the Q buffers (a tile's Q waits until every warpgroup has released the tile kQBuffers
earlier; with O staged through shared memory a warpgroup releases it only after its next tile's
first block), the turns (named barriers passed around the warpgroups; each warpgroup takes
blocks - 1 turns a tile, idle ones included) and the end marker. Each warpgroup sees `own`
of a tile's blocks and passes on the others first (rows past the sequence's end, diagonals,
varlen). What it leaves out: data, GEMM waits (they are local to a warpgroup) and the unit
scheduler (it feeds only the producer).

The consumer loop: open, start, run, finish. (Until stop 30 the model also had an overlapped
tile boundary, ForwardTile::overlap_next_tile, removed with that kernel variant: commit 7aaaa7a.)

    python3 tests/emulation/hopper_forward_pipeline.py   -> deadlock counts per order, exit 0
"""
import random
import sys
from dataclasses import dataclass


@dataclass
class Tile:
    blocks: int  # key blocks the tile walks
    own: list    # per warpgroup: how many of them it computes (the highest ones)


class Protocol:
    """Shared state: copies issued, releases per load, turn-barrier arrivals."""

    def __init__(self, tiles, warpgroups, stages, q_buffers, early_q=False, lookahead=False,
                 early_release=True):
        self.tiles, self.warpgroups, self.early_q = tiles, warpgroups, early_q
        self.lookahead, self.early_release = lookahead, early_release
        self.stages, self.q_buffers = stages, q_buffers
        self.k_issued = self.v_issued = 0  # loads issued so far (global load index)
        self.q_published = 0               # tiles (and the end marker) published
        self.k_released, self.v_released, self.q_released = {}, {}, {}
        self.turn_arrivals = [0] * warpgroups

    def released(self, table, index):
        return index < 0 or table.get(index, 0) == self.warpgroups

    @staticmethod
    def release(table, index):
        table[index] = table.get(index, 0) + 1


def producer(p):
    load = 0
    ahead = False  # this tile's Q went out during the tile before (the lookahead)
    for t, tile in enumerate(p.tiles):
        prepared, ahead = ahead, False
        if p.early_q and not prepared:
            yield lambda t=t: p.released(p.q_released, t - p.q_buffers)
            p.q_published += 1
        if tile.blocks > 0:  # without early_q, before the wait for the Q buffer
            yield lambda load=load: p.released(p.k_released, load - p.stages)
            p.k_issued += 1
        if not p.early_q and not prepared:
            yield lambda t=t: p.released(p.q_released, t - p.q_buffers)
            p.q_published += 1
        here = p.lookahead and tile.blocks >= p.stages + 2 and t + 1 < len(p.tiles)
        for block in range(tile.blocks):
            if block > 0:
                yield lambda load=load: p.released(p.k_released, load - p.stages)
                p.k_issued += 1
            if here and block == tile.blocks - 2:  # the next tile's Q, a tile ahead
                yield lambda t=t: p.released(p.q_released, t + 1 - p.q_buffers)
                p.q_published += 1
                ahead = True
            yield lambda load=load: p.released(p.v_released, load - p.stages)
            p.v_issued += 1
            load += 1
    yield lambda: p.released(p.q_released, len(p.tiles) - p.q_buffers)
    p.q_published += 1  # the end marker


def consumer(p, w, stage_o):
    """Warpgroup w's loop; yields the predicate it blocks on, acts when it holds."""
    waits = 0
    state = 0
    stored = [None]  # the tile whose staged O this warpgroup has not yet released

    def turn():
        nonlocal waits
        yield lambda k=waits: p.turn_arrivals[w] > k
        waits += 1
        p.turn_arrivals[(w + 1) % p.warpgroups] += 1

    def release_stored():
        if stored[0] is not None:
            Protocol.release(p.q_released, stored[0])
            stored[0] = None

    def pass_on_skipped(tile):
        nonlocal state
        own = tile.own[w]
        idle = tile.blocks - max(own, 1)
        for skipped in range(tile.blocks - own):
            yield lambda s=state: p.k_issued > s
            Protocol.release(p.k_released, state)
            yield lambda s=state: p.v_issued > s
            Protocol.release(p.v_released, state)
            state += 1
            if skipped < idle:
                yield from turn()

    def start_tile(tile):
        if p.early_release and tile.own[w] < 2:  # the kernel's start_tile: before it passes on
            release_stored()
        yield from pass_on_skipped(tile)
        if tile.own[w] > 0:
            yield lambda s=state: p.k_issued > s  # the first S GEMM's K

    def run_tile(t, tile):
        """From the first S GEMM (its K waited for) to the last P V (waited for, its V stage kept
        until finish)."""
        nonlocal state
        own = tile.own[w]
        if own == 0:
            if not stage_o:
                Protocol.release(p.q_released, t)
            release_stored()
            return None
        Protocol.release(p.k_released, state)
        if own == 1 and not stage_o:
            Protocol.release(p.q_released, t)
        release_stored()
        for i in range(own - 1):
            following = state + 1
            yield from turn_wait_then(following)
            Protocol.release(p.k_released, following)
            if i == own - 2 and not stage_o:
                Protocol.release(p.q_released, t)
            Protocol.release(p.v_released, state)
            state = following
        yield lambda s=state: p.v_issued > s
        v_state = state
        state += 1
        return v_state

    def turn_wait_then(following):
        nonlocal waits
        yield lambda k=waits: p.turn_arrivals[w] > k  # turn.wait
        waits += 1
        yield lambda s=following: p.k_issued > s       # S_j's K
        yield lambda s=state: p.v_issued > s           # P_{j-1} V_{j-1}'s V
        p.turn_arrivals[(w + 1) % p.warpgroups] += 1   # turn.pass

    def finish(t, tile, v_state):
        if tile.own[w] > 0:
            Protocol.release(p.v_released, v_state)
        if stage_o:
            stored[0] = t

    if w == p.warpgroups - 1:  # TurnBarrier::start: warpgroup 0 takes the first turn
        p.turn_arrivals[0] += 1

    for t in range(len(p.tiles) + 1):
        yield lambda t=t: p.q_published > t
        if t == len(p.tiles):
            return
        tile = p.tiles[t]
        yield from start_tile(tile)
        v_state = yield from run_tile(t, tile)
        finish(t, tile, v_state)


def run(tiles, warpgroups, stages, q_buffers, rng, early_q=False, stage_o=None, lookahead=False,
        early_release=True):
    """One random interleaving; returns None when every actor finished, else a description of
    the deadlock. stage_o: O staged in the Q buffer (released after the next tile's first
    block); None = the kernel's rule (kCanStageO: two Q buffers, two consumer warpgroups)."""
    p = Protocol(tiles, warpgroups, stages, q_buffers, early_q, lookahead, early_release)
    if stage_o is None:
        stage_o = q_buffers > 1 and warpgroups == 2
    actors = {"producer": producer(p)}
    for w in range(warpgroups):
        actors[f"warpgroup{w}"] = consumer(p, w, stage_o)
    pending = {}
    for name, gen in list(actors.items()):
        try:
            pending[name] = next(gen)
        except StopIteration:
            del actors[name]
    while actors:
        ready = [name for name in actors if pending[name]()]
        if not ready:
            return f"deadlock: {sorted(actors)} blocked"
        name = rng.choice(ready)
        try:
            pending[name] = actors[name].send(None)
        except StopIteration:
            del actors[name]
    return None


def random_tiles(rng, warpgroups):
    tiles = []
    for _ in range(rng.randint(1, 6)):
        blocks = rng.randint(0, 8)
        tiles.append(Tile(blocks, [rng.randint(0, blocks) for _ in range(warpgroups)]))
    return tiles


def count_deadlocks(trials, seed=0, early_q=False, q_buffers=2, stage_o=None, lookahead=False,
                    early_release=True):
    rng = random.Random(seed)
    deadlocks = 0
    for _ in range(trials):
        warpgroups = rng.choice([2, 3])
        stages = rng.choice([2, 3])
        tiles = random_tiles(rng, warpgroups)
        if run(tiles, warpgroups, stages, q_buffers, rng, early_q, stage_o, lookahead,
               early_release) is not None:
            deadlocks += 1
    return deadlocks


if __name__ == "__main__":
    for q_buffers in (1, 2):
        for early_q in (False, True):
            deadlocks = count_deadlocks(3000, early_q=early_q, q_buffers=q_buffers)
            print(f"{q_buffers} Q buffer(s), Q {'before' if early_q else 'after'} the first K: "
                  f"{deadlocks} deadlocks in 3000 schedules")
    for early_q in (False, True):
        deadlocks = count_deadlocks(3000, early_q=early_q, lookahead=True)
        print(f"2 Q buffers with the tile lookahead, Q {'before' if early_q else 'after'} the "
              f"first K: {deadlocks} deadlocks in 3000 schedules")
    deadlocks = count_deadlocks(3000, lookahead=True, early_release=False)
    print(f"The lookahead without the early release of a warpgroup with at most one block: "
          f"{deadlocks} deadlocks in 3000 schedules")
    deadlocks = count_deadlocks(3000, q_buffers=1, lookahead=True)
    print(f"The lookahead with one Q buffer (what the kernel's kQBuffers > 1 forbids): {deadlocks} "
          "deadlocks in 3000 schedules")
    deadlocks = count_deadlocks(3000, q_buffers=1, stage_o=True)
    print(f"O staged with one Q buffer (what kCanStageO forbids): {deadlocks} deadlocks in 3000 "
          "schedules")
    sys.exit(0)
