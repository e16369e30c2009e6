// Internal: tile shapes of the Hopper (sm_90a, wgmma + TMA) attention backward. Plain C++ so the
// host dispatcher can read shared-memory sizes without including CuTe or device code.
#pragma once

#include <cstdint>

namespace samattn::hopper {

// Head dims with a backward instantiation (fp16 and bf16; q and v share it).
inline constexpr int kBackwardHeadDims[] = {64, 96, 128, 192, 256};

constexpr bool is_backward_head_dim(int64_t head_dim) {
  for (int d : kBackwardHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Query rows per step. 128 at head_dim 64: the S^T / dP^T wgmmas get N = 128 (an N = 64 wgmma
// with both operands in shared memory reads them at the full shared-memory bandwidth, 128 B/clk)
// and the per-step waits, barriers and statistics are paid half as often; the accumulators (S^T
// and dP^T 64 registers each, dK, dV and dQ 32 each) fit the consumers' 240. 64 at head_dim 128,
// where dK and dV alone take 128 registers.
constexpr int backward_block_m(int64_t head_dim) { return head_dim <= 64 ? 128 : 64; }

// Above head dim 128 the dK and dV of a warpgroup's 64 keys would take 256 registers a thread (at
// 256). Both consumer warpgroups then own the same 64 keys: each computes the whole S^T and dP^T
// and keeps half of dK's, dV's and dQ's columns (7/5 of the tensor work of a step; the sm80
// backward's kColumnSplit does the same, benchmarks/NOTES.md stop 45). At head dim 192 (96-column
// halves) the tiles take 64-byte swizzle atoms (backward_kernel.cuh).
constexpr bool backward_splits_columns(int64_t head_dim) { return head_dim > 128; }

// Keys of a block: 64 per consumer warpgroup, or 64 shared by both when they split the columns.
constexpr int backward_block_n(int64_t head_dim) {
  return backward_splits_columns(head_dim) ? 64 : 128;
}

// Whether the tiles' rows are whole 128-byte swizzle atoms (64 16-bit elements); otherwise the
// atoms are 64 bytes (32 elements) wide (head dim 96).
constexpr bool backward_has_wide_atoms(int64_t head_dim) { return head_dim % 64 == 0; }

// Who computes a step's dQ = dS K (it needs both consumer warpgroups' halves of dS): at head
// dim 64 the warpgroups take turns, one computing the whole of it while the other runs ahead
// into its next step (1.02-1.06x the split below, H200, benchmarks/NOTES.md stop 24); at 128
// both meet at a barrier every step and compute half each (there the turns measured 0.95-0.98x).
// With 64-byte atoms the halves of K^T would start inside an atom (head dim 96: 48 of the
// atoms' 32 columns), which a wgmma descriptor cannot address, so those head dims take turns.
constexpr bool backward_alternates_dq(int64_t head_dim) {
  return head_dim <= 64 || !backward_has_wide_atoms(head_dim);
}
// Head dims where both dQ schedules compile (the tuning build's SAMATTN_HOPPER_BWD_VARIANT): not
// the column split's, which has one, nor those whose halves would split an atom.
constexpr bool backward_has_variants(int64_t head_dim) {
  return !backward_splits_columns(head_dim) && backward_has_wide_atoms(head_dim);
}

// The split schedule at 64 query rows a step (head dim 128) issues a step's dQ one step late,
// after the next step's softmax: a warpgroup then waits only for the other's dS of the previous
// step, so the two can run up to a step apart and one's softmax overlaps the other's GEMMs (with
// a barrier on the current step's dS both ran their softmax at the same time and the tensor
// cores idled). The dS ring then needs four buffers (backward_kernel.cuh, "Ordering").
constexpr bool backward_defers_dq(int64_t head_dim, bool alternates_dq) {
  return !alternates_dq && backward_block_m(head_dim) == 64 && !backward_splits_columns(head_dim);
}
// The column split: two per consumer warpgroup, each of which stores its own copy of the dS^T
// both computed, so that neither ever waits for the other.
constexpr int backward_ds_buffers(int64_t head_dim, bool defers_dq) {
  return defers_dq || backward_splits_columns(head_dim) ? 4 : 2;
}

// A tuning build (-DSAMATTN_HOPPER_TUNING=ON, benchmarks) also builds, for bf16, the schedule a
// head dim does not use by default; the environment variable SAMATTN_HOPPER_BWD_VARIANT selects
// one explicitly, to measure both side by side in one process.
enum class BackwardVariant { kDefault, kSplitDq, kAlternateDq };

// One block = (batch, kv head, backward_block_n(head_dim) keys): a producer warpgroup (one thread
// issues the TMA copies, one warp stages lse and D) and two consumer warpgroups, each owning 64 of
// the keys (the wgmma M of one warpgroup; both the same 64 when they split the columns) for the
// whole kernel. The block walks the query blocks of backward_block_m(head_dim) rows of every query
// head of its group through a kStages-deep ring of Q / dO tiles; dS goes through shared memory
// (backward_ds_buffers) for dQ = dS K.
struct BackwardConfig {
  static constexpr int kStages = 2;  // Q / dO / lse / D pipeline depth
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kStatsThreads = 32;  // the warp that stages lse and D
  static constexpr int kBarrierBytes = 1024;
};

// dQ of one step is 64-row fp32 fragments of backward_dq_fragment_cols columns (the m64nN wgmma
// accumulator's layout, whichever warpgroup computed them): two 64 x 64 ones at head dims 64
// (split by rows) and 128 (by columns), head_dim / 64 in the column split, three 64 x 32 ones at
// head dim 96. Each goes to shared memory in fragment order (lane l of warp v puts its values
// 4j..4j+3 at float4 slot v * slots + j * 32 + l, slots = backward_dq_warp_slots), and from there
// with one bulk reduce-add per warp and fragment into the accumulator, which keeps that order:
// per (batch, query head, block of backward_block_m rows) a contiguous chunk of block_m x
// head_dim floats, fragment f at f * backward_dq_fragment_floats floats. Rows are padded to
// whole blocks.
inline constexpr int kDqFragmentRows = 64;
constexpr int backward_dq_fragment_cols(int64_t head_dim) {
  return backward_has_wide_atoms(head_dim) ? 64 : 32;
}
constexpr int backward_dq_fragment_floats(int64_t head_dim) {
  return kDqFragmentRows * backward_dq_fragment_cols(head_dim);
}
// float4 slots of one warp in a fragment.
constexpr int backward_dq_warp_slots(int64_t head_dim) {
  return backward_dq_fragment_floats(head_dim) / 4 / 4;
}

constexpr int64_t backward_dq_accum_rows(int64_t seqlen_q, int64_t head_dim) {
  const int64_t block_m = backward_block_m(head_dim);
  return (seqlen_q + block_m - 1) / block_m * block_m;
}

// The fragments split the block's 128 rows (head_dim 64) or its columns.
constexpr bool backward_dq_split_rows(int64_t head_dim) {
  return backward_block_m(head_dim) == 2 * kDqFragmentRows;
}

// A float4 slot of a chunk (slot < block_m * head_dim / 4) holds, in its values 0 and 1, dQ(row,
// col) and dQ(row, col + 1) of the block, and in values 2 and 3 the same columns of row + 8.
// Inside a fragment (the m64n64 wgmma accumulator) a value sits with warp row / 16,
// lane (row % 8) * 4 + (col % 8) / 2 and value (col / 8) * 4 + ((row / 8) % 2) * 2 + col % 2.
struct DqSlotPosition {
  int row, col;
};
constexpr DqSlotPosition backward_dq_slot_position(int64_t head_dim, int slot) {
  const int fragment_slots = backward_dq_fragment_floats(head_dim) / 4;
  const int warp_slots = backward_dq_warp_slots(head_dim);
  const int fragment = slot / fragment_slots, in_fragment = slot % fragment_slots;
  const int warp = in_fragment / warp_slots, j = in_fragment % warp_slots / 32;
  const int lane = in_fragment % 32;
  const int r = warp * 16 + lane / 4, c = j * 8 + lane % 4 * 2;
  return backward_dq_split_rows(head_dim)
             ? DqSlotPosition{fragment * kDqFragmentRows + r, c}
             : DqSlotPosition{r, fragment * backward_dq_fragment_cols(head_dim) + c};
}

// Floats of a consumer warpgroup's dQ staging tile: the fragments it computes in one step. The
// column split adds dQ from registers with 16-byte atomics in the chunk's order: a staging tile
// would not fit beside K, V and two stages of Q and dO.
constexpr int backward_dq_staging_floats(int64_t head_dim, bool alternates_dq) {
  const int step_floats = backward_block_m(head_dim) * static_cast<int>(head_dim);
  return backward_splits_columns(head_dim) ? 0 : alternates_dq ? step_floats : step_floats / 2;
}

// K and V tiles, kStages x (Q and dO tiles), the dS buffers, a dQ staging tile per consumer
// warpgroup, lse and D per stage, barriers, for the head dim's default schedule (checked against
// each instantiation's SharedStorage by a static_assert in backward_kernel.cuh; the other
// schedule needs no more). 227 KiB at head dim 64, 226 KiB at 128 and 256, 178 KiB at 96 and 192.
constexpr int backward_smem_bytes(int64_t head_dim, int element_bytes) {
  using C = BackwardConfig;
  const int64_t block_m = backward_block_m(head_dim);
  const int64_t block_n = backward_block_n(head_dim);
  const bool alternates = backward_alternates_dq(head_dim);
  const int64_t ds_buffers =
      backward_ds_buffers(head_dim, backward_defers_dq(head_dim, alternates));
  const int64_t tiles =
      2 * block_n * head_dim + 2 * C::kStages * block_m * head_dim + ds_buffers * block_m * block_n;
  const int64_t dq_staging =
      int64_t{C::kConsumerWarpgroups} * backward_dq_staging_floats(head_dim, alternates) * 4;
  const int64_t stats = 2 * C::kStages * block_m * 4;
  return static_cast<int>(tiles * element_bytes + dq_staging + stats) + C::kBarrierBytes;
}

}  // namespace samattn::hopper
