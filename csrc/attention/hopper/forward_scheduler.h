// Internal: which query tiles each block of the persistent Hopper forward computes, and in what
// order. Plain C++ (host and device) so the launcher sizes the grid from the same numbers.
//
// The grid has at most one block per SM (varlen: one block per unit by default, see
// ForwardKernelOptions); block c takes work units c, c + grid, c + 2 grid, ...
// (a static schedule: every warp of the block derives the same sequence, nothing is exchanged).
// Units are numbered head by head, so the blocks running at one time share few (batch, head)
// pairs and their K and V stay in L2.
//  - Without causal masking a unit is one query tile; all cost the same.
//  - With causal masking query tile m of a head sees m + 1 key blocks (for square tiles), so a
//    unit pairs tile m_blocks - 1 - p (the heavier, run first) with tile p: every pair costs
//    about m_blocks + 1 key blocks, and the static round robin stays balanced without an atomic
//    tile counter (which would need zeroed global memory on every launch).
#pragma once

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

struct TileSchedule {
  int32_t units;           // batch * heads_q * units_per_head
  int32_t m_blocks;        // query tiles per (batch, head)
  int32_t units_per_head;  // m_blocks, or ceil(m_blocks / 2) when paired
  bool paired;             // causal: a unit is two tiles of one head

  // How many tiles (1 or 2) unit `unit` holds.
  SAMATTN_HOST_DEVICE int tiles_in(int32_t unit) const {
    const int32_t p = unit % units_per_head;
    return paired && 2 * p + 1 != m_blocks ? 2 : 1;
  }

  // Tile `half` (0, or 1 when tiles_in(unit) == 2) of unit `unit`.
  SAMATTN_HOST_DEVICE QueryTile tile(int32_t unit, int half) const {
    const int32_t batch_head = unit / units_per_head;
    const int32_t p = unit % units_per_head;
    if (!paired) return {batch_head, p};
    return {batch_head, half == 0 ? m_blocks - 1 - p : p};
  }
};

// The caller has checked that batch_heads * m_blocks fits in int32.
inline TileSchedule make_tile_schedule(int64_t batch_heads, int64_t seqlen_q, int block_m,
                                       bool causal) {
  TileSchedule s{};
  s.m_blocks = static_cast<int32_t>((seqlen_q + block_m - 1) / block_m);
  s.paired = causal && s.m_blocks > 1;
  s.units_per_head = s.paired ? (s.m_blocks + 1) / 2 : s.m_blocks;
  s.units = static_cast<int32_t>(batch_heads * s.units_per_head);
  return s;
}

}  // namespace samattn::hopper

#undef SAMATTN_HOST_DEVICE
