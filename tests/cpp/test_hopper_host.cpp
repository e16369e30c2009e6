// The host-checkable parts of the Hopper forward, on the CPU: its tile schedule
// (forward_scheduler.h: every query tile taken exactly once by the round robin over any grid and
// by the work counter in any order of fetches, causal units of paired tiles costing the same) and
// the tile tables (forward_config.h: every variant fits an H100 block and the wgmma shapes).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention/hopper/forward_config.h"
#include "attention/hopper/forward_launch.h"
#include "attention/hopper/forward_scheduler.h"
#include "samattn/error.h"

namespace samattn::hopper {
namespace {

struct ScheduleCase {
  int64_t batch_heads, seqlen_q;
  bool causal;
};

// Walks the schedule exactly as each block of a `grid`-block launch does and counts the visits
// of every (batch_head, m_block).
std::vector<int> visits(const TileSchedule& s, int grid, int64_t batch_heads) {
  std::vector<int> count(batch_heads * s.m_blocks, 0);
  for (int block = 0; block < grid; ++block) {
    for (int32_t unit = block; unit < s.units; unit += grid) {
      for (int half = 0; half < s.tiles_in(unit); ++half) {
        const QueryTile t = s.tile(unit, half);
        EXPECT_GE(t.batch_head, 0);
        EXPECT_LT(t.batch_head, batch_heads);
        EXPECT_GE(t.m_block, 0);
        EXPECT_LT(t.m_block, s.m_blocks);
        ++count[int64_t{t.batch_head} * s.m_blocks + t.m_block];
      }
    }
  }
  return count;
}

TEST(HopperSchedule, EveryTileOnceForAnyGrid) {
  const ScheduleCase cases[] = {
      {1, 1, false},   {1, 1, true},      {3, 128, true},    {3, 129, true},   {2, 589, true},
      {2, 589, false}, {256, 1024, true}, {16, 16384, true}, {7, 1000, false}, {50, 300, true}};
  for (const ScheduleCase& c : cases) {
    // Without a tail of single tiles, with one of a few units, and with one longer than the
    // whole schedule (every head in it).
    for (int64_t tail_units : {0, 3, 264, 1 << 20}) {
      const TileSchedule s =
          make_tile_schedule(c.batch_heads, c.seqlen_q, 128, c.causal, tail_units);
      for (int grid : {1, 2, 5, 132, 1000}) {
        SCOPED_TRACE(::testing::Message()
                     << "batch_heads " << c.batch_heads << " seqlen_q " << c.seqlen_q << " causal "
                     << c.causal << " tail_units " << tail_units << " grid " << grid);
        const std::vector<int> count = visits(s, grid, c.batch_heads);
        EXPECT_TRUE(std::all_of(count.begin(), count.end(), [](int n) { return n == 1; }));
      }
    }
  }
}

// The tail of a causal schedule: whole heads, at least tail_units units' worth, the last ones;
// their tiles one per unit after every pair, heaviest (highest m_block) first; a schedule without
// pairs has none.
TEST(HopperSchedule, CausalTailIsTheLastHeadsSingleTilesHeaviestFirst) {
  const TileSchedule s = make_tile_schedule(16, 16384, 192, true, 264);
  ASSERT_TRUE(s.paired);
  EXPECT_EQ(s.m_blocks, 86);
  EXPECT_EQ(s.units_per_head, 43);
  EXPECT_EQ(s.tail_heads, 7);  // ceil(264 / 43)
  EXPECT_EQ(s.paired_units, 9 * 43);
  EXPECT_EQ(s.units, 9 * 43 + 7 * 86);
  for (int32_t unit = 0; unit < s.units; ++unit) {
    const bool tail = unit >= s.paired_units;
    EXPECT_EQ(s.tiles_in(unit), tail ? 1 : 2);
    if (tail && unit + 1 < s.units) {
      EXPECT_GE(s.tile(unit, 0).m_block, s.tile(unit + 1, 0).m_block);
      EXPECT_GE(s.tile(unit, 0).batch_head, 9);
    }
  }
  EXPECT_EQ(s.tile(s.paired_units, 0).m_block, 85);
  EXPECT_EQ(s.tile(s.units - 1, 0).m_block, 0);
  const TileSchedule dense = make_tile_schedule(16, 16384, 192, false, 264);
  EXPECT_EQ(dense.tail_heads, 0);
  EXPECT_EQ(dense.units, 16 * 86);
}

// The dynamic schedule's work counter (next_unit in forward_scheduler.h) with the blocks'
// fetches interleaved in random orders, as atomics on one counter are: every unit taken once,
// the fetch that resets the counter is the launch's last, and the counter ends at zero.
TEST(HopperSchedule, WorkCounterHandsOutEveryUnitOnceAndEndsAtZero) {
  std::mt19937 random(20261201);
  const ScheduleCase cases[] = {
      {1, 129, false}, {3, 589, true}, {50, 300, true}, {64, 4096, false}, {512, 512, true}};
  for (const ScheduleCase& c : cases) {
    const TileSchedule s = make_tile_schedule(c.batch_heads, c.seqlen_q, 192, c.causal, 264);
    for (int grid : {1, 5, 132}) {
      if (s.units < grid) continue;  // the launcher passes no counter then
      SCOPED_TRACE(::testing::Message() << "units " << s.units << " grid " << grid);
      std::vector<int> taken(s.units, 0);
      std::vector<int> working;  // blocks whose last fetch found a unit
      for (int block = 0; block < grid; ++block) {
        ++taken[block];  // block b starts with unit b
        working.push_back(block);
      }
      int32_t counter = 0;
      int resets = 0, fetches_after_reset = 0;
      while (!working.empty()) {
        const size_t pick = random() % working.size();
        const int32_t value = counter++;
        fetches_after_reset += resets;
        if (s.fetch_resets_counter(value)) {
          counter = 0;
          ++resets;
        }
        const int32_t next = s.unit_of_fetch(grid, value);
        if (next < s.units) {
          ++taken[next];
        } else {
          working.erase(working.begin() + static_cast<std::ptrdiff_t>(pick));
        }
      }
      EXPECT_TRUE(std::all_of(taken.begin(), taken.end(), [](int n) { return n == 1; }));
      EXPECT_EQ(resets, 1);
      EXPECT_EQ(fetches_after_reset, 0);
      EXPECT_EQ(counter, 0);
    }
  }
}

TEST(HopperSchedule, CausalUnitsCostTheSame) {
  // Square 128 x 128 tiles: query tile m sees m + 1 key blocks.
  for (int64_t seqlen : {256, 640, 1024, 4096, 16384}) {
    const TileSchedule s = make_tile_schedule(4, seqlen, 128, true);
    ASSERT_TRUE(s.paired);
    int lightest = 1 << 30, heaviest = 0;
    for (int32_t unit = 0; unit < s.units; ++unit) {
      int blocks = 0;
      for (int half = 0; half < s.tiles_in(unit); ++half) blocks += s.tile(unit, half).m_block + 1;
      // With an odd tile count the middle tile runs alone; it is the only lighter unit.
      if (s.tiles_in(unit) == 2) {
        lightest = std::min(lightest, blocks);
        heaviest = std::max(heaviest, blocks);
      }
      // The heavier tile of a pair comes first.
      EXPECT_GE(s.tile(unit, 0).m_block, s.tile(unit, s.tiles_in(unit) - 1).m_block);
    }
    EXPECT_EQ(lightest, heaviest) << "seqlen " << seqlen;
    EXPECT_EQ(heaviest, s.m_blocks + 1) << "seqlen " << seqlen;
  }
}

TEST(HopperSchedule, NonCausalUnitsAreSingleTilesHeadByHead) {
  const TileSchedule s = make_tile_schedule(3, 1000, 128, false);
  EXPECT_FALSE(s.paired);
  EXPECT_EQ(s.m_blocks, 8);
  EXPECT_EQ(s.units, 24);
  for (int32_t unit = 0; unit < s.units; ++unit) {
    EXPECT_EQ(s.tiles_in(unit), 1);
    EXPECT_EQ(s.tile(unit, 0).batch_head, unit / 8);
    EXPECT_EQ(s.tile(unit, 0).m_block, unit % 8);
  }
}

// Every entry of every head dim's tile table (the default and the tuning build's variants):
// shared memory within the 227 KiB an H100 block may opt in to, the register split within the
// 64K file, block_n a multiple of 16 (one P k-block per 16 keys; also N/8 even for the
// accumulator-as-A regrouping) and at most 256 (one wgmma and one TMA box), and the default a
// valid index.
TEST(HopperTileTables, EveryVariantFitsAnH100Block) {
  constexpr int kH100SmemOptIn = 227 * 1024;
  constexpr int kRegisterFile = 64 * 1024;
  for (int d : kSupportedHeadDims) {
    ASSERT_GE(default_tile_variant(d), 0);
    ASSERT_LT(default_tile_variant(d), tile_variants(d));
    for (int variant = 0; variant < tile_variants(d); ++variant) {
      SCOPED_TRACE(::testing::Message() << "head dim " << d << " variant " << variant);
      const ForwardTile tile = forward_tile(d, variant);
      EXPECT_LE(forward_smem_bytes(tile, d, 2), kH100SmemOptIn);
      // setmaxnreg only moves registers the launch gave the block.
      const int at_launch = kRegisterFile / tile.threads() / 8 * 8;
      EXPECT_LE(128 * tile.producer_registers +
                    128 * tile.consumer_warpgroups * tile.consumer_registers(),
                at_launch * tile.threads());
      EXPECT_EQ(tile.producer_registers % 8, 0);
      EXPECT_EQ(tile.consumer_registers() % 8, 0);
      EXPECT_GE(tile.producer_registers, 24);  // setmaxnreg's lower bound
      EXPECT_LE(tile.consumer_registers(), 256);
      EXPECT_EQ(tile.block_n % 16, 0);
      EXPECT_LE(tile.block_n, 256);
      EXPECT_GE(tile.stages, 2);
      EXPECT_GE(tile.q_buffers, 1);
    }
  }
}

// Head dim 64 runs its two-warpgroup entry on causal problems of at most 512 queries and kept
// keys (measured faster there), head dim 128 its early-Q entry on problems of at most 2048
// queries and kept keys without kv_stride; everything else runs the default entry. Those entries
// are compiled into every build.
TEST(HopperTileTables, ShortProblemsTakeTheirOwnTiles) {
  EXPECT_EQ(forward_tile(64, kShortCausalTile64).consumer_warpgroups, 2);
  EXPECT_EQ(forward_tile(64, default_tile_variant(64)).consumer_warpgroups, 3);
  EXPECT_TRUE(tile_in_every_build(64, kShortCausalTile64));
  EXPECT_TRUE(tile_in_every_build(64, default_tile_variant(64)));
  struct ShapeCase {
    int64_t head_dim;
    bool causal;
    int64_t seqlen_q, kept_keys, kv_stride;
    int expected;
  };
  const int default64 = default_tile_variant(64), default128 = default_tile_variant(128);
  const ShapeCase shapes[] = {
      {64, true, 512, 512, 1, kShortCausalTile64},
      {64, true, 1, 500, 1, kShortCausalTile64},
      {64, true, 512, 512, 4, kShortCausalTile64},
      {64, true, 513, 512, 1, default64},
      {64, true, 512, 513, 1, default64},
      {64, true, 1024, 1024, 1, default64},
      {64, true, 1024, 1024, 4, default64},
      {64, false, 512, 512, 1, default64},
      {128, false, 512, 512, 1, kShortTile128},
      {128, true, 512, 512, 1, kShortTile128},
      {128, false, 2048, 2048, 1, kShortTile128},
      {128, true, 2048, 2048, 1, kShortTile128},
      {128, false, 1, 2000, 1, kShortTile128},
      {128, true, 1, 2000, 1, kShortTile128},
      {128, false, 2049, 2048, 1, default128},
      {128, true, 2049, 2048, 1, default128},
      {128, false, 2048, 2049, 1, default128},
      {128, true, 2048, 2049, 1, default128},
      {128, false, 1024, 1024, 4, default128},
      {128, true, 1024, 1024, 4, default128},
      {256, true, 512, 512, 1, default_tile_variant(256)},
  };
  for (const ShapeCase& s : shapes) {
    EXPECT_EQ(tile_variant_for_shape(s.head_dim, s.causal, s.seqlen_q, s.kept_keys, s.kv_stride),
              s.expected)
        << "head dim " << s.head_dim << (s.causal ? " causal" : "") << " " << s.seqlen_q << " x "
        << s.kept_keys << " kv_stride " << s.kv_stride;
  }
  EXPECT_TRUE(forward_tile(128, kShortTile128).early_q);
  EXPECT_FALSE(forward_tile(128, default_tile_variant(128)).early_q);
  EXPECT_TRUE(tile_in_every_build(128, kShortTile128));
  EXPECT_TRUE(tile_in_every_build(128, default_tile_variant(128)));
  for (int variant = 0; variant < tile_variants(128); ++variant) {
    EXPECT_EQ(tile_in_every_build(128, variant),
              variant == default_tile_variant(128) || variant == kShortTile128);
  }
  // Head dim 96 runs head dim 128's tiles, and every build compiles the same entries of its
  // table; only entry 0 differs, by its one softmax copy. Head dim 192 has its own table, whose
  // default entry is head dim 256's tile.
  EXPECT_TRUE(is_supported_head_dim(96));
  EXPECT_EQ(tile_variants(96), tile_variants(128));
  for (int variant = 0; variant < tile_variants(96); ++variant) {
    SCOPED_TRACE(::testing::Message() << "variant " << variant);
    EXPECT_EQ(tile_in_every_build(96, variant), tile_in_every_build(128, variant));
    const ForwardTile d96 = forward_tile(96, variant), d128 = forward_tile(128, variant);
    EXPECT_EQ(d96.consumer_warpgroups, d128.consumer_warpgroups);
    EXPECT_EQ(d96.block_n, d128.block_n);
    EXPECT_EQ(d96.stages, d128.stages);
    EXPECT_EQ(d96.q_buffers, d128.q_buffers);
    EXPECT_EQ(d96.producer_registers, d128.producer_registers);
    EXPECT_EQ(d96.lean_tile_start, d128.lean_tile_start);
    EXPECT_EQ(d96.early_q, d128.early_q);
    EXPECT_EQ(d96.hoisted_limits, d128.hoisted_limits);
    EXPECT_EQ(d96.one_softmax_copy, variant == 0 || d128.one_softmax_copy);
  }
  EXPECT_TRUE(is_supported_head_dim(192));
  EXPECT_EQ(forward_tile(192, 0).block_n, forward_tile(256).block_n);
  EXPECT_EQ(forward_tile(192, 0).q_buffers, forward_tile(256).q_buffers);
  for (int variant = 0; variant < tile_variants(192); ++variant) {
    EXPECT_EQ(tile_in_every_build(192, variant), variant == default_tile_variant(192)) << variant;
  }
  for (int variant = 0; variant < tile_variants(256); ++variant) {
    EXPECT_EQ(tile_in_every_build(256, variant), variant == default_tile_variant(256));
  }
}

// The hoisted row limits are a tuning entry's until measured: no entry that a build without
// SAMATTN_HOPPER_TUNING compiles has them, and each entry with them is an every-build entry plus
// the limits (D = 64: the short causal tile; D = 128: the short tile), so the two time the same
// tile.
TEST(HopperTileTables, HoistedLimitsAreATuningTwin) {
  const auto same_but_limits = [](const ForwardTile& a, const ForwardTile& b) {
    return a.consumer_warpgroups == b.consumer_warpgroups && a.block_n == b.block_n &&
           a.stages == b.stages && a.q_buffers == b.q_buffers &&
           a.producer_registers == b.producer_registers && a.lean_tile_start == b.lean_tile_start &&
           a.early_q == b.early_q;
  };
  for (int d : kSupportedHeadDims) {
    for (int variant = 0; variant < tile_variants(d); ++variant) {
      SCOPED_TRACE(::testing::Message() << "head dim " << d << " variant " << variant);
      const ForwardTile tile = forward_tile(d, variant);
      if (tile_in_every_build(d, variant)) EXPECT_FALSE(tile.hoisted_limits);
    }
  }
  ASSERT_TRUE(forward_tile(64, 2).hoisted_limits);
  EXPECT_TRUE(same_but_limits(forward_tile(64, 2), forward_tile(64, kShortCausalTile64)));
  ASSERT_TRUE(forward_tile(128, 1).hoisted_limits);
  EXPECT_TRUE(same_but_limits(forward_tile(128, 1), forward_tile(128, kShortTile128)));
}

// SAMATTN_HOPPER_TILE: unset or empty is the caller's entry (its shape's); another valid index
// is that entry where the build compiles it (every build compiles tile_in_every_build's) and an
// error naming the build option otherwise; an invalid one an error naming the variable; head
// dim 256 (one entry) ignores it.
TEST(HopperTileTables, VariantFromTheEnvironment) {
  auto with = [](const char* value, int head_dim) {
    setenv("SAMATTN_HOPPER_TILE", value, 1);
    try {
      const int variant =
          forward_tile_variant_from_environment(head_dim, default_tile_variant(head_dim));
      unsetenv("SAMATTN_HOPPER_TILE");
      return std::to_string(variant);
    } catch (const Error& error) {
      unsetenv("SAMATTN_HOPPER_TILE");
      return std::string(error.what());
    }
  };
  unsetenv("SAMATTN_HOPPER_TILE");
  EXPECT_EQ(forward_tile_variant_from_environment(64, default_tile_variant(64)),
            default_tile_variant(64));
  EXPECT_EQ(forward_tile_variant_from_environment(64, kShortCausalTile64), kShortCausalTile64);
  EXPECT_EQ(with("", 128), std::to_string(default_tile_variant(128)));
  EXPECT_EQ(with("1", 256), std::to_string(default_tile_variant(256)));
  for (const char* bad : {"7", "-1", "1x", "tile1"}) {
    const std::string got = with(bad, 128);
    EXPECT_NE(got.find("SAMATTN_HOPPER_TILE must be a tile variant index in [0, "),
              std::string::npos)
        << bad << ": " << got;
  }
  for (int d : {64, 128}) {
    for (int variant = 0; variant < tile_variants(d); ++variant) {
      const std::string got = with(std::to_string(variant).c_str(), d);
      const bool chosen = got == std::to_string(variant);
      const bool needs_tuning = !tile_in_every_build(d, variant) &&
                                got.find("-DSAMATTN_HOPPER_TUNING=ON") != std::string::npos;
      EXPECT_TRUE(chosen || needs_tuning)
          << "head dim " << d << " variant " << variant << ": " << got;
    }
  }
}

// SAMATTN_HOPPER_ABLATION: unset is every default option; each name in a comma-separated list
// switches its own option and no other; an unknown name is an error naming the variable and
// every valid name.
TEST(HopperOptions, AblationsFromTheEnvironment) {
  auto with = [](const char* value) {
    setenv("SAMATTN_HOPPER_ABLATION", value, 1);
    const ForwardKernelOptions options = forward_options_from_environment();
    unsetenv("SAMATTN_HOPPER_ABLATION");
    return options;
  };
  unsetenv("SAMATTN_HOPPER_ABLATION");
  const ForwardKernelOptions defaults = forward_options_from_environment();
  EXPECT_TRUE(defaults.q_before_list);
  EXPECT_TRUE(defaults.lean_mask);
  EXPECT_TRUE(defaults.list_under_coords);
  EXPECT_TRUE(defaults.tile_lookahead);
  EXPECT_TRUE(defaults.tail_singles);
  EXPECT_TRUE(defaults.partial_first_tile);
  const ForwardKernelOptions q_after_list = with("q_after_list");
  EXPECT_FALSE(q_after_list.q_before_list);
  EXPECT_TRUE(q_after_list.lean_mask);
  EXPECT_TRUE(q_after_list.list_under_coords);
  EXPECT_TRUE(q_after_list.tile_lookahead);
  const ForwardKernelOptions no_lookahead = with("no_lookahead");
  EXPECT_FALSE(no_lookahead.tile_lookahead);
  EXPECT_TRUE(no_lookahead.q_before_list);
  EXPECT_TRUE(no_lookahead.lean_mask);
  EXPECT_TRUE(no_lookahead.tail_singles);
  const ForwardKernelOptions paired_tail = with("paired_tail");
  EXPECT_FALSE(paired_tail.tail_singles);
  EXPECT_TRUE(paired_tail.tile_lookahead);
  EXPECT_TRUE(paired_tail.dynamic_schedule);
  EXPECT_TRUE(paired_tail.partial_first_tile);
  const ForwardKernelOptions partial_last_tile = with("partial_last_tile");
  EXPECT_FALSE(partial_last_tile.partial_first_tile);
  EXPECT_TRUE(partial_last_tile.tail_singles);
  EXPECT_TRUE(partial_last_tile.tile_lookahead);
  const ForwardKernelOptions both = with("scaled_mask,list_after_coords");
  EXPECT_FALSE(both.lean_mask);
  EXPECT_FALSE(both.list_under_coords);
  EXPECT_TRUE(both.q_before_list);
  EXPECT_TRUE(both.pingpong);
  setenv("SAMATTN_HOPPER_ABLATION", "q_before_list", 1);
  try {
    forward_options_from_environment();
    ADD_FAILURE() << "an unknown ablation was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("SAMATTN_HOPPER_ABLATION"), std::string::npos) << message;
    EXPECT_NE(message.find("q_after_list"), std::string::npos) << message;
    EXPECT_NE(message.find("scaled_mask"), std::string::npos) << message;
    EXPECT_NE(message.find("no_lookahead"), std::string::npos) << message;
    EXPECT_NE(message.find("paired_tail"), std::string::npos) << message;
    EXPECT_NE(message.find("partial_last_tile"), std::string::npos) << message;
  }
  unsetenv("SAMATTN_HOPPER_ABLATION");
}

}  // namespace
}  // namespace samattn::hopper
