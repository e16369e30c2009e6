"""Where a Hopper forward tile's time goes: the timeline of a diagnostic build.

Needs a build configured with -DSAMATTN_HOPPER_TRACE=ON (csrc/attention/hopper/forward_trace.cuh):
its kernel stamps events with the SM's clock and the launcher writes them to
SAMATTN_HOPPER_TRACE_FILE after each call. This script runs each shape a few times, keeps the
last call's timeline and prints, per consumer warpgroup, the median cycles of each phase of a tile:

  boundary: last P V landed -> epilogue done -> next tile's Q ready -> first S landed -> first
            softmax done -> first turn taken
  loop:     turn wait (previous iteration done -> turn taken), K/V wait + issue (-> GEMMs issued),
            S wait, softmax, P V wait, rescale + convert; split into the tile's first turn, its
            middle turns and its last turn

and the tile's total (tile start to the next tile start). Cycles are the SM clock's, so they
are comparable with each other, not with a clock-locked profile. The trace's own stores cost a
little: the script also times this build's calls without a trace file (the kernel then skips
its stores), to compare with a normal build's benchmark.

  python benchmarks/trace_hopper_forward.py --out trace.json
"""
import argparse
import array
import datetime
import json
import os
import statistics
import struct
import tempfile
from collections import defaultdict

import torch

import samattn
from samattn.bench.masks import _block_map_case, _samattn_call

MAGIC = 0x53414D5452414345
EVENTS = ["", "tile_start", "first_s_landed", "first_softmax_done", "turn_taken", "gemms_issued",
          "s_landed", "softmax_done", "pv_landed", "iteration_done", "last_pv_landed",
          "epilogue_done", "unit_taken", "k_issued", "v_issued", "q_issued", "q_landed",
          "first_k_landed", "store_released", "o_staged", "o_stage_synced", "o_store_issued",
          "list_requested", "list_ready"]
# (label, batch, heads, seqlen, head_dim, samattn.attention's options); the window is issue
# 6's sliding window 256, whose tiles walk 3 key blocks (2 of them masked).
SHAPES = [
    ("D128 S1k", 16, 16, 1024, 128, {}),
    ("D128 stride4", 4, 16, 4096, 128, {"kv_stride": 4}),
    ("D128 S16k", 1, 16, 16384, 128, {}),
    ("D64 S1k causal", 16, 16, 1024, 64, {"causal": True}),
    ("D128 S16k window256", 1, 16, 16384, 128, {"causal": True, "window": (256, 0)}),
    # Issue 6's block map (the masks benchmark's 10% row, seed 0): ~14 key blocks a tile, whose
    # list the producer waits for before the tile's first K.
    ("D128 S16k block-sparse 10%", 1, 16, 16384, 128, {"block_map_fraction": 0.1}),
]


class Trace:
    """The records of a trace file: lane(block, lane) -> that lane's (clock, code) pairs."""

    def __init__(self, path):
        with open(path, "rb") as f:
            magic, self.blocks, self.lanes, self.capacity, self.block_m, self.block_n = (
                struct.unpack("<6q", f.read(48)))
            if magic != MAGIC:
                raise ValueError(f"{path}: not a samattn Hopper forward trace")
            self.words = array.array("Q")
            self.words.frombytes(f.read())
        if len(self.words) != self.blocks * self.lanes * self.capacity * 2:
            raise ValueError(f"{path}: {len(self.words)} words, not what its header says")

    def lane(self, block, lane):
        first = (block * self.lanes + lane) * self.capacity * 2
        words = self.words[first:first + 2 * self.capacity]
        return list(zip(words[0::2], words[1::2]))


def decode(records):
    """One lane's records -> list of (clock, event name, tile, block), in program order."""
    out = []
    for clock, code in records:
        if code == 0:
            break
        out.append((clock, EVENTS[code >> 48], (code >> 16) & 0xFFFFFFFF, code & 0xFFFF))
    return out


def phases(events):
    """Per tile of one consumer lane: the phase durations (cycles) as a list of dicts."""
    tiles = defaultdict(list)
    for clock, name, tile, block in events:
        tiles[tile].append((clock, name, block))
    result = []
    # The last Q wait of a lane returns the end of the work, which has no tile_start.
    order = [t for t in sorted(tiles) if any(name == "tile_start" for _, name, _ in tiles[t])]
    for index, tile in enumerate(order):
        ev = tiles[tile]
        first = {}
        for clock, name, _ in ev:
            first.setdefault(name, clock)
        row = {}
        if "first_s_landed" in first:
            row["q_ready_to_first_s"] = first["first_s_landed"] - first["tile_start"]
        if "first_softmax_done" in first and "first_s_landed" in first:
            row["first_softmax"] = first["first_softmax_done"] - first["first_s_landed"]
        turns = [i for i, e in enumerate(ev) if e[1] == "turn_taken"]
        if turns and "first_softmax_done" in first:
            row["first_turn_wait"] = ev[turns[0]][0] - first["first_softmax_done"]
        loop = []
        previous_done = first.get("first_softmax_done")
        for i in turns:
            seq = {name: clock for clock, name, _ in ev[i:i + 6]}
            if not all(k in seq for k in ("turn_taken", "gemms_issued", "s_landed",
                                          "softmax_done", "pv_landed", "iteration_done")):
                continue
            loop.append({
                "turn_wait": seq["turn_taken"] - previous_done if previous_done else 0,
                "kv_wait_issue": seq["gemms_issued"] - seq["turn_taken"],
                "s_wait": seq["s_landed"] - seq["gemms_issued"],
                "softmax": seq["softmax_done"] - seq["s_landed"],
                "pv_wait": seq["pv_landed"] - seq["softmax_done"],
                "rescale_convert": seq["iteration_done"] - seq["pv_landed"],
            })
            previous_done = seq["iteration_done"]
        row["loop"] = loop
        if "last_pv_landed" in first and previous_done is not None:
            row["last_pv_wait"] = first["last_pv_landed"] - previous_done
        if "epilogue_done" in first and "last_pv_landed" in first:
            row["epilogue"] = first["epilogue_done"] - first["last_pv_landed"]
        # Sub-phases: (name, from event, to event), each within this tile.
        for key, begin, end in (("q_landed_to_tile_start", "q_landed", "tile_start"),
                                ("tile_start_to_first_k", "tile_start", "first_k_landed"),
                                ("first_k_to_first_s", "first_k_landed", "first_s_landed"),
                                ("store_release", "first_softmax_done", "store_released"),
                                ("o_normalise_stage", "last_pv_landed", "o_staged"),
                                ("o_fence_sync", "o_staged", "o_stage_synced"),
                                ("o_store_issue", "o_stage_synced", "o_store_issued"),
                                ("o_issue_to_epilogue_done", "o_store_issued", "epilogue_done")):
            if begin in first and end in first:
                row[key] = first[end] - first[begin]
        if index + 1 < len(order):
            nxt = tiles[order[index + 1]]
            start_next = next(c for c, n, _ in nxt if n == "tile_start")
            row["tile_total"] = start_next - first["tile_start"]
            if "epilogue_done" in first:
                row["wait_next_q"] = start_next - first["epilogue_done"]
                q_next = next((c for c, n, _ in nxt if n == "q_landed"), None)
                if q_next is not None:
                    row["epilogue_done_to_q_landed"] = q_next - first["epilogue_done"]
        row["key_blocks"] = next(b for c, n, b in ev if n == "tile_start")
        result.append(row)
    return result


SCALAR_PHASES = ("q_ready_to_first_s", "first_softmax", "first_turn_wait", "last_pv_wait",
                 "epilogue", "wait_next_q", "tile_total", "key_blocks", "q_landed_to_tile_start",
                 "tile_start_to_first_k", "first_k_to_first_s", "store_release",
                 "o_normalise_stage", "o_fence_sync", "o_store_issue", "o_issue_to_epilogue_done",
                 "epilogue_done_to_q_landed")


def median(values):
    return float(statistics.median(values)) if values else float("nan")


def summarise(trace):
    """Median cycles per phase and consumer warpgroup over every block's tiles."""
    summary = {}
    for lane in range(1, trace.lanes):
        rows = []
        for block in range(trace.blocks):
            rows.extend(phases(decode(trace.lane(block, lane))))
        entry = {"tiles": len(rows)}
        for key in SCALAR_PHASES:
            entry[key] = median([r[key] for r in rows if key in r])
        for part, pick in (("first_turn", lambda lp: lp[:1]), ("middle_turns", lambda lp: lp[1:-1]),
                           ("last_turn", lambda lp: lp[-1:])):
            turns = [t for r in rows for t in pick(r["loop"])]
            entry[part] = {k: median([t[k] for t in turns])
                           for k in ("turn_wait", "kv_wait_issue", "s_wait", "softmax", "pv_wait",
                                     "rescale_convert")}
            entry[part]["count"] = len(turns)
        summary[f"warpgroup{lane - 1}"] = entry
    return summary


def producer_lead(trace):
    """Median cycles between a K's copy being issued and the first consumer turn that uses it."""
    leads = []
    for block in range(trace.blocks):
        issued = {}
        for clock, name, tile, key_block in decode(trace.lane(block, 0)):
            if name == "k_issued":
                issued.setdefault((tile, key_block), clock)
        for clock, name, tile, key_block in decode(trace.lane(block, 1)):
            if name == "turn_taken" and (tile, key_block) in issued:
                leads.append(clock - issued[(tile, key_block)])
    return median(leads)


def producer_timing(trace):
    """Median cycles: the unit's arrival after the previous tile's last V copy, and the first
    consumer warpgroup's return from its wait for a Q after that Q's copy was issued."""
    unit_after_last_v, q_lead = [], []
    for block in range(trace.blocks):
        last_v, q_issued = {}, {}
        unit_taken = []
        for clock, name, tile, _ in decode(trace.lane(block, 0)):
            if name == "v_issued":
                last_v[tile] = clock
            elif name == "unit_taken":
                unit_taken.append((tile, clock))
            elif name == "q_issued":
                q_issued[tile] = clock
        for tile, clock in unit_taken:
            if tile - 1 in last_v:
                unit_after_last_v.append(clock - last_v[tile - 1])
        for clock, name, tile, _ in decode(trace.lane(block, 1)):
            if name == "q_landed" and tile in q_issued:
                q_lead.append(clock - q_issued[tile])
    return {"unit_after_previous_last_v": median(unit_after_last_v),
            "q_issue_to_consumer_q_landed": median(q_lead)}


# The boundary's events, in whatever order the kernel runs them: those of the finished tile
# (its last P V, the epilogue's steps) and those of the next one (its Q, first K and S, first
# softmax, the release of the previous store, its first turn).
BOUNDARY_EVENTS = (("previous", "last_pv_landed"), ("previous", "o_staged"),
                   ("previous", "o_store_issued"), ("previous", "epilogue_done"),
                   ("next", "q_landed"), ("next", "tile_start"), ("next", "first_k_landed"),
                   ("next", "first_s_landed"), ("next", "first_softmax_done"),
                   ("next", "store_released"), ("next", "turn_taken"))


def boundary_timeline(trace):
    """Per consumer warpgroup, the median cycles from a tile's last turn done (its last
    iteration_done) to each boundary event, over every tile followed by another:
    order-independent, so a reordered boundary reads the same way. Consumer events are their
    first occurrence in the tile; the producer's (lane 0, the same SM's clock) are when it
    issued the finished tile's last K and V and the next tile's unit, first K, Q and first V:
    whether the next tile's loads go out late or take long to land."""
    timeline = {}
    for lane in range(1, trace.lanes):
        offsets = defaultdict(list)
        for block in range(trace.blocks):
            first = defaultdict(dict)  # tile -> event -> first clock
            last = defaultdict(dict)  # tile -> event -> last clock
            for source in (lane, 0):
                for clock, name, tile, _ in decode(trace.lane(block, source)):
                    key = name if source else "producer." + name
                    first[tile].setdefault(key, clock)
                    last[tile][key] = clock
            for tile, events in list(last.items()):
                anchor = events.get("iteration_done")
                if anchor is None or "tile_start" not in first.get(tile + 1, {}):
                    continue
                for which, name in BOUNDARY_EVENTS:
                    clock = first[tile if which == "previous" else tile + 1].get(name)
                    if clock is not None:
                        offsets[f"{which}.{name}"].append(clock - anchor)
                for name in ("producer.k_issued", "producer.v_issued"):
                    if name in events:
                        offsets[f"previous.last_{name}"].append(events[name] - anchor)
                for name in ("producer.unit_taken", "producer.list_requested",
                             "producer.list_ready", "producer.k_issued", "producer.q_issued",
                             "producer.v_issued"):
                    if name in first[tile + 1]:
                        offsets[f"next.{name}"].append(first[tile + 1][name] - anchor)
        timeline[f"warpgroup{lane - 1}"] = {k: median(v) for k, v in offsets.items()}
    return timeline


def run_shape(label, batch, heads, seqlen, head_dim, options, path):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=gen) for _ in range(3))
    if "block_map_fraction" in options:
        case = _block_map_case(options["block_map_fraction"], seqlen, seed=0)

        def call():
            _samattn_call(case, q, k, v)
    else:
        def call():
            samattn.attention(q, k, v, backend="hopper", **options)

    # Untraced calls of this build first (no file: the kernel skips its stores), then one traced.
    os.environ.pop("SAMATTN_HOPPER_TRACE_FILE", None)
    for _ in range(3):
        call()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    os.environ["SAMATTN_HOPPER_TRACE_FILE"] = path
    call()
    torch.cuda.synchronize()
    os.environ.pop("SAMATTN_HOPPER_TRACE_FILE", None)
    trace = Trace(path)
    return {
        "label": label, "block_m": trace.block_m, "block_n": trace.block_n,
        "untraced_call_ms_median": median(times),
        "producer_k_lead_cycles": producer_lead(trace),
        "producer": producer_timing(trace),
        "warpgroups": summarise(trace),
        "boundary_timeline": boundary_timeline(trace),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hopper_forward_trace.json")
    parser.add_argument("--shapes", default="",
                        help="comma-separated substrings: only the shapes whose label has one")
    args = parser.parse_args()
    wanted = [w for w in args.shapes.split(",") if w]
    path = os.path.join(tempfile.mkdtemp(), "trace.bin")
    # The tile variant traced (SAMATTN_HOPPER_TILE, "" = the default entry) and when.
    results = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("SAMATTN_COMMIT", ""),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "tile_variant": os.environ.get("SAMATTN_HOPPER_TILE", ""), "shapes": []}
    for shape in SHAPES:
        if wanted and not any(w in shape[0] for w in wanted):
            continue
        result = run_shape(*shape, path)
        results["shapes"].append(result)
        print(f"== {result['label']} (tile {result['block_m']} x {result['block_n']}; untraced "
              f"call {result['untraced_call_ms_median']:.3f} ms; producer K lead "
              f"{result['producer_k_lead_cycles']:.0f} cycles; "
              + ", ".join(f"{k} {v:.0f}" for k, v in result["producer"].items()) + ")")
        for name, entry in result["warpgroups"].items():
            print(f"  {name}: {entry['tiles']} tiles, median tile {entry['tile_total']:.0f} cycles "
                  f"over {entry['key_blocks']:.0f} key blocks")
            print("    boundary: " + ", ".join(
                f"{k} {entry[k]:.0f}" for k in ("last_pv_wait", "epilogue", "wait_next_q",
                                                "q_ready_to_first_s", "first_softmax",
                                                "first_turn_wait")))
            print("    inside: " + ", ".join(f"{k} {entry[k]:.0f}" for k in SCALAR_PHASES[8:]))
            timeline = sorted(result["boundary_timeline"][name].items(), key=lambda kv: kv[1])
            print("    boundary from the last turn done: " +
                  ", ".join(f"{k} {v:.0f}" for k, v in timeline))
            for part in ("first_turn", "middle_turns", "last_turn"):
                turn = entry[part]
                print(f"    {part} ({turn['count']}): " + ", ".join(
                    f"{k} {v:.0f}" for k, v in turn.items() if k != "count"))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
