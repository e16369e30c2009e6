"""How much of the Hopper forward's time the persistent schedule's last round leaves idle: a CPU
model of forward_scheduler.h's units on a grid of one block per SM, not a measurement.

A tile costs `boundary` + its key blocks (in units of one key block's time per warpgroup turn);
block c starts with unit c and, as the work counter hands them out, each block that finishes
takes the next unit (units numbered head by head; a causal unit pairs tile m_blocks - 1 - p with
tile p). The model reports the makespan over the even split of the same work (sum / SMs): the
loss of the last round, which every cell of issue 3's matrix pays, since B·S = 16k tokens and
H = 16 give 2048 tiles of 128 rows (1376 of 192) whatever S is. Two alternatives are modelled
beside the current schedule:
  - tail singles: the last heads' tiles, two rounds of units' worth, handed out one by one,
    heaviest first across those heads (make_tile_schedule's tail_units);
  - split tail: the last round's work spread evenly over every block (a split-KV tail whose
    merge is free): the bound any tail scheme can reach.

    python3 benchmarks/schedule_model.py [--sms 132] [--boundary 1.5]
"""

from __future__ import annotations

import argparse
import heapq
import math


def tile_blocks(m: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                causal: bool) -> int:
    if not causal:
        return math.ceil(seqlen_k / block_n)
    last_row = min((m + 1) * block_m, seqlen_q) - 1
    return math.ceil(min(last_row + 1, seqlen_k) / block_n)


def head_tiles(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, causal: bool,
               boundary: float) -> list[float]:
    """The cost of each query tile of one head, m_block ascending."""
    return [boundary + tile_blocks(m, block_m, block_n, seqlen_q, seqlen_k, causal)
            for m in range(math.ceil(seqlen_q / block_m))]


def units(batch_heads: int, cost: list[float], causal: bool, tail_units: int = 0) -> list[float]:
    """The cost of each work unit in the order make_tile_schedule numbers them: head by head,
    a causal unit pairing tile m_blocks - 1 - p with tile p; with tail_units, the last
    ceil(tail_units / units per head) heads' tiles one per unit, m_block descending, the heads
    interleaved."""
    m_blocks = len(cost)
    paired = causal and m_blocks > 1
    if paired:
        per_head = [cost[m_blocks - 1 - p] + (cost[p] if 2 * p + 1 != m_blocks else 0.0)
                    for p in range((m_blocks + 1) // 2)]
    else:
        per_head = list(cost)
    tail_heads = min(batch_heads, -(-tail_units // len(per_head))) if paired else 0
    order = per_head * (batch_heads - tail_heads)
    order += [cost[m] for m in range(m_blocks - 1, -1, -1) for _ in range(tail_heads)]
    return order


def finish_times(unit_costs: list[float], sms: int) -> list[float]:
    """Each block's finishing time under the work counter (blocks without a unit: 0)."""
    finish = [(c, i) for i, c in enumerate(unit_costs[:sms])]
    finish += [(0.0, i) for i in range(len(finish), sms)]
    heapq.heapify(finish)
    for cost in unit_costs[sms:]:
        t, block = heapq.heappop(finish)
        heapq.heappush(finish, (t + cost, block))
    return [t for t, _ in finish]


def water_level(times: list[float], work: float) -> float:
    """The makespan when `work` is spread over blocks free at `times` (sorted), evenly."""
    level, filled = times[0], 0
    for i, t in enumerate(times):
        if work <= (t - level) * i:
            break
        work -= (t - level) * i
        level, filled = t, i + 1
    return level + work / filled if filled else level


def schedules(batch_heads: int, cost: list[float], causal: bool, sms: int) -> dict[str, float]:
    """Makespan over the even split: the paired schedule, the tail of single tiles
    (tail_units = 2 SMs, forward_launch.cuh) and the split tail's bound."""
    current = units(batch_heads, cost, causal)
    even = sum(current) / sms
    tail = units(batch_heads, cost, causal, 2 * sms)
    # The split tail: the schedule as now until fewer units are left than blocks, then their
    # work poured evenly over the blocks as they free up (water filling).
    head = current[:max(len(current) - sms + 1, 0)] if len(current) >= sms else []
    times = sorted(finish_times(head, sms)) if head else [0.0] * sms
    split = water_level(times, sum(current[len(head):]))
    return {"units": len(current), "current": max(finish_times(current, sms)) / even,
            "tail singles": max(finish_times(tail, sms)) / even, "split tail": split / even}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--boundary", type=float, default=1.5,
                        help="a tile's start and end, in key-block turns")
    args = parser.parse_args()
    print(f"makespan / even split, {args.sms} SMs, tile boundary {args.boundary} turns")
    print(f"{'shape':34s} {'units':>6s} {'current':>8s} {'tail singles':>13s} {'split tail':>11s}")
    rows = []
    for head_dim, block_m in ((64, 192), (128, 128)):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            batch = 16384 // seqlen
            for causal in (False, True):
                # Head dim 64 causal at S <= 1k runs 128-row tiles (kShortCausalTile64).
                bm = 128 if head_dim == 64 and causal and seqlen <= 1024 else block_m
                cost = head_tiles(seqlen, seqlen, bm, 128, causal, args.boundary)
                rows.append((f"B{batch} H16 S{seqlen} D{head_dim}{' causal' if causal else ''}",
                             schedules(batch * 16, cost, causal, args.sms)))
    cost = head_tiles(4096, 1024, 128, 128, False, args.boundary)
    rows.append(("B4 H16 S4096 D128 kv_stride 4", schedules(64, cost, False, args.sms)))
    for name, r in rows:
        print(f"{name:34s} {r['units']:6d} {r['current']:8.3f} {r['tail singles']:13.3f} "
              f"{r['split tail']:11.3f}")


if __name__ == "__main__":
    main()
