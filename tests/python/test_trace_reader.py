"""The reader of the Hopper forward's diagnostic timeline (benchmarks/trace_hopper_forward.py):
a synthetic trace file with known phase lengths goes in, those lengths must come out."""

import importlib.util
import os
import struct

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "trace_hopper_forward", os.path.join(ROOT, "benchmarks", "trace_hopper_forward.py"))
trace_reader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_reader)

EVENT = {name: index for index, name in enumerate(trace_reader.EVENTS) if name}
TURN = ("turn_taken", "gemms_issued", "s_landed", "softmax_done", "pv_landed", "iteration_done")
# The length of the phase that ends at each event, in cycles (all different, so a phase that
# reads the wrong pair of events shows).
LENGTH = {"tile_start": 11, "first_k_landed": 13, "first_s_landed": 17, "first_softmax_done": 19,
          "store_released": 23, "turn_taken": 29, "gemms_issued": 31, "s_landed": 37,
          "softmax_done": 41, "pv_landed": 43, "iteration_done": 47, "last_pv_landed": 53,
          "o_staged": 59, "o_stage_synced": 61, "o_store_issued": 67, "epilogue_done": 71,
          "q_landed": 73}
TILES, KEY_BLOCKS, CAPACITY = 3, 4, 128


def record(clock, name, tile, block):
    return clock, (EVENT[name] << 48) | (tile << 16) | block


def consumer_lane(start):
    """Three tiles of four key blocks (three turns each), then the end-of-work Q wait."""
    records, clock = [], start
    for tile in range(TILES):
        clock += LENGTH["q_landed"]
        records.append(record(clock, "q_landed", tile, 0))
        for name in ("tile_start", "first_k_landed", "first_s_landed", "first_softmax_done",
                     "store_released"):
            clock += LENGTH[name]
            records.append(record(clock, name, tile, KEY_BLOCKS if name == "tile_start" else 3))
        for block in (2, 1, 0):
            for name in TURN:
                clock += LENGTH[name]
                records.append(record(clock, name, tile, block))
        for name in ("last_pv_landed", "o_staged", "o_stage_synced", "o_store_issued",
                     "epilogue_done"):
            clock += LENGTH[name]
            records.append(record(clock, name, tile, 0))
    records.append(record(clock + LENGTH["q_landed"], "q_landed", TILES, 1))
    return records


def producer_lane():
    records = []
    for tile in range(TILES):
        base = 1000 * tile
        records.append(record(base, "unit_taken", tile, 0))
        records.append(record(base + 5, "k_issued", tile, 3))
        records.append(record(base + 7, "q_issued", tile, tile % 2))
        records.append(record(base + 9, "v_issued", tile, 3))
        records.append(record(base + 100, "k_issued", tile, 2))
        records.append(record(base + 300, "v_issued", tile, 0))
    return records


def write_trace(path, blocks=2, consumer_lanes=2, magic=trace_reader.MAGIC):
    lanes = 1 + consumer_lanes
    words = [0] * (blocks * lanes * CAPACITY * 2)
    for block in range(blocks):
        for lane in range(lanes):
            records = producer_lane() if lane == 0 else consumer_lane(start=0)
            first = (block * lanes + lane) * CAPACITY * 2
            for i, (clock, code) in enumerate(records):
                words[first + 2 * i], words[first + 2 * i + 1] = clock, code
    with open(path, "wb") as f:
        f.write(struct.pack("<6q", magic, blocks, lanes, CAPACITY, 128, 128))
        f.write(struct.pack(f"<{len(words)}Q", *words))


def test_every_phase_is_the_distance_between_its_two_events(tmp_path):
    path = tmp_path / "trace.bin"
    write_trace(path)
    summary = trace_reader.summarise(trace_reader.Trace(str(path)))
    assert sorted(summary) == ["warpgroup0", "warpgroup1"]
    for entry in summary.values():
        # The end-of-work Q wait is not a tile.
        assert entry["tiles"] == 2 * TILES
        assert entry["key_blocks"] == KEY_BLOCKS
        assert entry["q_landed_to_tile_start"] == LENGTH["tile_start"]
        assert entry["tile_start_to_first_k"] == LENGTH["first_k_landed"]
        assert entry["first_k_to_first_s"] == LENGTH["first_s_landed"]
        assert entry["q_ready_to_first_s"] == LENGTH["first_k_landed"] + LENGTH["first_s_landed"]
        assert entry["first_softmax"] == LENGTH["first_softmax_done"]
        assert entry["store_release"] == LENGTH["store_released"]
        assert entry["first_turn_wait"] == LENGTH["store_released"] + LENGTH["turn_taken"]
        assert entry["o_normalise_stage"] == LENGTH["o_staged"]
        assert entry["o_fence_sync"] == LENGTH["o_stage_synced"]
        assert entry["o_store_issue"] == LENGTH["o_store_issued"]
        assert entry["o_issue_to_epilogue_done"] == LENGTH["epilogue_done"]
        assert entry["epilogue"] == sum(LENGTH[name] for name in (
            "o_staged", "o_stage_synced", "o_store_issued", "epilogue_done"))
        assert entry["last_pv_wait"] == LENGTH["last_pv_landed"]
        assert entry["epilogue_done_to_q_landed"] == LENGTH["q_landed"]
        assert entry["wait_next_q"] == LENGTH["q_landed"] + LENGTH["tile_start"]
        tile = (sum(LENGTH.values()) + 2 * sum(LENGTH[name] for name in TURN))
        assert entry["tile_total"] == tile
        middle = entry["middle_turns"]
        assert middle["count"] == 2 * TILES
        assert (middle["turn_wait"], middle["kv_wait_issue"], middle["s_wait"], middle["softmax"],
                middle["pv_wait"], middle["rescale_convert"]) == (
            LENGTH["turn_taken"], LENGTH["gemms_issued"], LENGTH["s_landed"],
            LENGTH["softmax_done"], LENGTH["pv_landed"], LENGTH["iteration_done"])
        assert entry["first_turn"]["count"] == entry["last_turn"]["count"] == 2 * TILES


def test_producer_timing_pairs_copies_with_the_tiles_that_use_them(tmp_path):
    path = tmp_path / "trace.bin"
    write_trace(path, blocks=1)
    trace = trace_reader.Trace(str(path))
    timing = trace_reader.producer_timing(trace)
    # Tile t's unit is taken 1000 t cycles in, the previous tile's last V copy at 1000 (t - 1) + 300.
    assert timing["unit_after_previous_last_v"] == 700
    # The first consumer lane's Q wait for tile 0 returns at cycle 73; its copy went out at 7.
    first_q = LENGTH["q_landed"]
    assert trace_reader.decode(trace.lane(0, 1))[0] == (first_q, "q_landed", 0, 0)
    leads = []
    q_landed = [c for c, n, t, _ in trace_reader.decode(trace.lane(0, 1)) if n == "q_landed"
                and t < TILES]
    for tile, clock in enumerate(q_landed):
        leads.append(clock - (1000 * tile + 7))
    assert timing["q_issue_to_consumer_q_landed"] == sorted(leads)[len(leads) // 2]


def test_a_file_that_is_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "trace.bin"
    write_trace(path, blocks=1, magic=1234)
    with pytest.raises(ValueError, match="not a samattn Hopper forward trace"):
        trace_reader.Trace(str(path))


def test_boundary_timeline_places_every_event_against_the_last_turn(tmp_path):
    path = tmp_path / "trace.bin"
    write_trace(path, blocks=1)
    timeline = trace_reader.boundary_timeline(trace_reader.Trace(str(path)))
    assert sorted(timeline) == ["warpgroup0", "warpgroup1"]
    records = [trace_reader.decode([r])[0] for r in consumer_lane(start=0)]
    # Tiles 0 and 1 are followed by a tile; tile 2 only by the end of the work.
    anchors = [max(c for c, n, t, _ in records if n == "iteration_done" and t == tile)
               for tile in (0, 1)]
    epilogue = ["last_pv_landed", "o_staged", "o_stage_synced", "o_store_issued", "epilogue_done"]
    opening = ["q_landed", "tile_start", "first_k_landed", "first_s_landed", "first_softmax_done",
               "store_released", "turn_taken"]
    expected, clock = {}, 0
    for name in epilogue + opening:
        clock += LENGTH[name]
        which = "previous" if name in epilogue else "next"
        if name != "o_stage_synced":
            expected[f"{which}.{name}"] = clock
    producer = {"previous.last_producer.k_issued": (100, 0), "previous.last_producer.v_issued":
                (300, 0), "next.producer.unit_taken": (0, 1), "next.producer.k_issued": (5, 1),
                "next.producer.q_issued": (7, 1), "next.producer.v_issued": (9, 1)}
    for key, (offset, tile_shift) in producer.items():
        values = [1000 * (tile + tile_shift) + offset - anchors[tile] for tile in (0, 1)]
        expected[key] = sum(values) / 2
    for entry in timeline.values():
        assert entry == pytest.approx(expected)
