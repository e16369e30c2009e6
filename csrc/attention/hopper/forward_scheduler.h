// Internal: which query tiles each block of the persistent Hopper forward computes, and in what
// order. Plain C++ (host and device) so the launcher sizes the grid from the same numbers.
//
// The grid has at most one block per SM (varlen without a work counter: one block per unit, see
// ForwardKernelOptions). Block c starts with work unit c. Units are numbered head by head, so the
// blocks running at one time share few (batch, head) pairs and their K and V stay in L2.
//  - Without causal masking a unit is one query tile; all cost the same.
//  - With causal masking query tile m of a head sees m + 1 key blocks (for square tiles), so a
//    unit pairs tile m_blocks - 1 - p (the heavier, run first) with tile p: every pair costs
//    about m_blocks + 1 key blocks. Pairs of equal cost leave the last round of a launch
//    with fewer units than blocks (688 pairs of head dim 64's 192-row tiles at S = 16k on 132
//    SMs: 5.2 rounds take 6); so the last heads, at least tail_units tiles' worth, are handed
//    out as single tiles, heaviest first across those heads (benchmarks/schedule_model.py:
//    makespan over the even split 1.12-1.15 -> 1.01-1.02 at head dim 64 causal S >= 2k, 1.031 ->
//    1.006-1.015 at head dim 128 causal).
// Its next units come from one of two schedules:
//  - dynamic (a work counter, stream_counter.h): the block's scheduler thread takes the next unit
//    not yet taken with atomicAdd once the TMA thread has issued the current one's last K,
//    so a block that finishes early takes more. The fetch that takes the counter's last value
//    resets it to zero.
//  - static (no counter: while a CUDA graph is captured, or SAMATTN_HOPPER_ABLATION=
//    static_schedule): units c + grid, c + 2 grid, ... A fixed round robin aliases with periodic
//    unit costs: with two pairs per head of 3 and 6 key blocks (head dim 64, 512 rows, causal)
//    and an even grid, half the blocks got every heavy unit.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define SAMATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAMATTN_HOST_DEVICE inline
#endif

namespace samattn::hopper {

struct QueryTile {
  int32_t batch_head;  // b * heads_q + h
  int32_t m_block;     // query rows [m_block * block_m, (m_block + 1) * block_m)
};

// Tile `half` of work unit `unit` (TileSchedule::tile), as the kernel's producer hands it to the
// consumers; unit < 0: no more tiles.
struct alignas(8) ScheduledTile {  // 8: moved as one 64-bit shared-memory access
  int32_t unit;
  int32_t half;
};

inline constexpr ScheduledTile kNoMoreTiles{-1, 0};

struct TileSchedule {
  int32_t units;           // paired_units + tail_heads * m_blocks
  int32_t m_blocks;        // query tiles per (batch, head)
  int32_t units_per_head;  // m_blocks, or ceil(m_blocks / 2) when paired
  bool paired;             // causal: a unit is two tiles of one head (before the tail)
  // Units [0, paired_units) go head by head (pairs when paired); the rest are the single tiles
  // of the last tail_heads heads, m_block descending, the heads interleaved.
  int32_t paired_units;
  int32_t tail_heads;
  int32_t* counter;  // the dynamic schedule's work counter; null: the static schedule

  // How many tiles (1 or 2) unit `unit` holds.
  SAMATTN_HOST_DEVICE int tiles_in(int32_t unit) const {
    const int32_t p = unit % units_per_head;
    return paired && unit < paired_units && 2 * p + 1 != m_blocks ? 2 : 1;
  }

  // The dynamic schedule: a fetch that took `taken` from the counter hands its block unit
  // grid + taken (none when >= units). Every block fetches once per unit it takes (its first,
  // blockIdx.x, included), the last fetch finding none: units fetches in all, taking the values
  // 0 .. units - 1 (units >= grid), so the one that takes units - 1 is the launch's last and
  // resets the counter.
  SAMATTN_HOST_DEVICE int32_t unit_of_fetch(int32_t grid, int32_t taken) const {
    return grid + taken;
  }
  SAMATTN_HOST_DEVICE bool fetch_resets_counter(int32_t taken) const { return taken == units - 1; }

  // Tile `half` (0, or 1 when tiles_in(unit) == 2) of unit `unit`.
  SAMATTN_HOST_DEVICE QueryTile tile(int32_t unit, int half) const {
    if (unit >= paired_units) {
      const int32_t k = unit - paired_units;
      const int32_t first_tail_head = paired_units / units_per_head;
      return {first_tail_head + k % tail_heads, m_blocks - 1 - k / tail_heads};
    }
    const int32_t batch_head = unit / units_per_head;
    const int32_t p = unit % units_per_head;
    if (!paired) return {batch_head, p};
    return {batch_head, half == 0 ? m_blocks - 1 - p : p};
  }
};

// The caller has checked that batch_heads * m_blocks fits in int32. tail_units (paired
// schedules only; 0: none): how many units' worth of the last heads go out as single tiles,
// rounded up to whole heads.
inline TileSchedule make_tile_schedule(int64_t batch_heads, int64_t seqlen_q, int block_m,
                                       bool causal, int64_t tail_units = 0) {
  TileSchedule s{};
  s.m_blocks = static_cast<int32_t>((seqlen_q + block_m - 1) / block_m);
  s.paired = causal && s.m_blocks > 1;
  s.units_per_head = s.paired ? (s.m_blocks + 1) / 2 : s.m_blocks;
  const int64_t tail_heads =
      s.paired ? std::min(batch_heads, (tail_units + s.units_per_head - 1) / s.units_per_head) : 0;
  s.tail_heads = static_cast<int32_t>(tail_heads);
  s.paired_units = static_cast<int32_t>((batch_heads - tail_heads) * s.units_per_head);
  s.units = static_cast<int32_t>(s.paired_units + tail_heads * s.m_blocks);
  return s;
}

#if defined(__CUDACC__)
// The unit this block takes after `unit` (>= units: none). The block's scheduler thread calls
// it once per unit, when the TMA thread has issued that unit's last K: its last V waits for a
// stage that frees a turn later, under which the atomic's latency hides, and fetching no
// earlier leaves the units not yet started to whichever block frees up first.
__device__ __forceinline__ int32_t next_unit(const TileSchedule& s, int32_t unit) {
  const int32_t grid = static_cast<int32_t>(gridDim.x);
  if (s.counter == nullptr) return unit + grid;
  const int32_t taken = atomicAdd(s.counter, 1);
  if (s.fetch_resets_counter(taken)) atomicExch(s.counter, 0);  // ready for the next launch
  return s.unit_of_fetch(grid, taken);
}
#endif

}  // namespace samattn::hopper

#undef SAMATTN_HOST_DEVICE
