// Internal: tile shapes of the SIMT backward kernels, in one place.
#pragma once

namespace samattn::simt {

// 256 threads in 16 row groups of 16 lanes, as in the forward. Products over the head dimension
// (q.k and dout.v) stream kDimChunk columns of both operands through shared memory; products
// over a block's rows (P^T dout, dS^T q, dS k) stage up to 16 KiB of rows at a time. Every tile
// fits the default 48 KiB, so no shared-memory opt-in is needed on any target.
template <typename Acc, int kHeadDimBucket>
struct BackwardTileBase {
  static constexpr int kThreads = 256;
  // Two blocks per multiprocessor caps registers at 128 per thread: 16 warps hide the latency
  // of the shared-memory operand loads. At this cap the dK/dV kernel spills a few loop-invariant
  // addresses (reloaded at the heads of the tile loops, never inside the FMA loops). sm_75 fits
  // only one block of these tiles in its 64 KiB, so there the cap buys nothing.
  static constexpr int kMinBlocks = 2;
  static constexpr int kRowGroups = 16;
  static constexpr int kThreadsPerRow = kThreads / kRowGroups;
  static constexpr int kDimChunk = 16;
  static constexpr int kPad = 16 / sizeof(Acc);  // one 16-byte vector per padded row
  static constexpr int kOutColsPerThread = kHeadDimBucket / kThreadsPerRow;
  static constexpr int kStagedBytes = 16 * 1024;
  static constexpr int kRowsThatFit = kStagedBytes / (kHeadDimBucket * int(sizeof(Acc)));

  static_assert(kThreadsPerRow == 16, "row groups are the 16 lanes of a half-warp");
  static_assert(kOutColsPerThread >= 1, "tile too small for the threads");
};

// dQ: one block per (batch, query head, kBlockM queries), walking the visible key blocks; each
// thread holds kRowsPerThread x kOutColsPerThread of dQ. kBlockM caps dQ at 32 KiB per block
// (32 registers per thread): 64 queries up to bucket 128 (fp32) or 64 (fp64), halved per
// doubling beyond. Otherwise the tiles of the chunked forward.
template <typename Acc, int kHeadDimBucket>
struct BackwardDqConfig : BackwardTileBase<Acc, kHeadDimBucket> {
  using Base = BackwardTileBase<Acc, kHeadDimBucket>;
  static constexpr int kAccumulatorBudget = 32 * 1024;  // bytes of dQ per block
  static constexpr int kRowsThatFitBudget =
      kAccumulatorBudget / (kHeadDimBucket * int(sizeof(Acc)));
  static constexpr int kBlockM = kRowsThatFitBudget < 64 ? kRowsThatFitBudget : 64;
  static constexpr int kBlockN = sizeof(Acc) == 8 ? 32 : 64;
  static constexpr int kRowsPerThread = kBlockM / Base::kRowGroups;      // queries
  static constexpr int kKeysPerThread = kBlockN / Base::kThreadsPerRow;  // score columns
  static constexpr int kStrideM = kBlockM + Base::kPad;
  static constexpr int kStrideN = kBlockN + Base::kPad;
  static constexpr int kStagedRows = Base::kRowsThatFit < kBlockN ? Base::kRowsThatFit : kBlockN;
  static constexpr int kSmemBytes = (Base::kDimChunk * (kStrideM + kStrideN) + kBlockN * kStrideM +
                                     kStagedRows * kHeadDimBucket) *
                                    int(sizeof(Acc));
  static_assert(kBlockN % kStagedRows == 0, "staged rows must split the key block evenly");
  static_assert(kSmemBytes <= 48 * 1024, "dQ tiles exceed 48 KiB of shared memory");
};

// dK/dV: one block per (batch, key head, kBlockN keys), walking the group's query heads and the
// query blocks (kBlockM rows) that see its keys; each thread holds kKeysPerThread x
// kOutColsPerThread of both dK and dV. kBlockN caps each accumulator at 32 KiB per block, i.e.
// 32 registers per thread for dK plus 32 for dV: 64 keys up to bucket 128 (fp32) or 64 (fp64),
// halved per doubling beyond.
template <typename Acc, int kHeadDimBucket>
struct BackwardDkDvConfig : BackwardTileBase<Acc, kHeadDimBucket> {
  using Base = BackwardTileBase<Acc, kHeadDimBucket>;
  static constexpr int kAccumulatorBudget = 32 * 1024;  // bytes of dK (or dV) per block
  static constexpr int kKeysThatFit = kAccumulatorBudget / (kHeadDimBucket * int(sizeof(Acc)));
  static constexpr int kMaxBlockN = sizeof(Acc) == 8 ? 32 : 64;  // P and dS tiles in 48 KiB
  static constexpr int kBlockN = kKeysThatFit < kMaxBlockN ? kKeysThatFit : kMaxBlockN;
  static constexpr int kBlockM = 32;
  static constexpr int kKeysPerThread = kBlockN / Base::kRowGroups;         // dK/dV rows
  static constexpr int kQueriesPerThread = kBlockM / Base::kThreadsPerRow;  // score columns
  static constexpr int kStrideM = kBlockM + Base::kPad;
  static constexpr int kStrideN = kBlockN + Base::kPad;
  static constexpr int kStagedRows = Base::kRowsThatFit < kBlockM ? Base::kRowsThatFit : kBlockM;
  static constexpr int kSmemBytes = (Base::kDimChunk * (kStrideM + kStrideN) +
                                     2 * kBlockM * kStrideN + kStagedRows * kHeadDimBucket) *
                                    int(sizeof(Acc));
  static_assert(kKeysPerThread >= 1, "fewer keys than row groups");
  static_assert(kBlockM % kStagedRows == 0, "staged rows must split the query block evenly");
  static_assert(kSmemBytes <= 48 * 1024, "dK/dV tiles exceed 48 KiB of shared memory");
};

}  // namespace samattn::simt
