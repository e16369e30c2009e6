// Internal: tile shapes of the SIMT forward kernel, in one place.
#pragma once

namespace samattn::simt {

// Head dimensions are rounded up to one of these buckets; each bucket is one instantiation.
inline constexpr int kHeadDimBuckets[] = {32, 64, 128, 256};

constexpr int head_dim_bucket(int head_dim) {
  return head_dim <= 32 ? 32 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

// A block of 256 threads owns kBlockM query rows and walks the keys kBlockN at a time.
// Threads form 16 row groups of 16: thread (row_group, lane_in_row) holds a
// kRowsPerThread x kKeysPerThread tile of scores and a kRowsPerThread x kOutColsPerThread tile
// of the output, so a row's softmax statistics stay inside 16 lanes of one warp.
template <typename Acc, int kHeadDimBucket>
struct ForwardConfig {
  static constexpr int kThreads = 256;
  static constexpr int kRowGroups = 16;
  static constexpr int kThreadsPerRow = kThreads / kRowGroups;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = sizeof(Acc) == 8 ? 32 : 64;
  static constexpr int kRowsPerThread = kBlockM / kRowGroups;
  static constexpr int kKeysPerThread = kBlockN / kThreadsPerRow;
  static constexpr int kOutColsPerThread = kHeadDimBucket / kThreadsPerRow;
  // q.k is accumulated over the head dimension kDimChunk columns at a time.
  static constexpr int kDimChunk = 16;
  // Rows of shared tiles indexed by query or key are padded by one 16-byte vector, which keeps
  // vector alignment and spreads the transposed stores over more banks.
  static constexpr int kPad = 16 / sizeof(Acc);
  static constexpr int kStrideM = kBlockM + kPad;
  static constexpr int kStrideN = kBlockN + kPad;
  // V is staged kValueRows keys at a time so the tile stays within 16 KiB.
  static constexpr int kValueTileBytes = 16 * 1024;
  static constexpr int kValueRowsFit = kValueTileBytes / (kHeadDimBucket * int(sizeof(Acc)));
  static constexpr int kValueRows = kValueRowsFit < kBlockN ? kValueRowsFit : kBlockN;

  static constexpr int kQTileElems = kDimChunk * kStrideM;
  static constexpr int kKTileElems = kDimChunk * kStrideN;
  static constexpr int kPTileElems = kBlockN * kStrideM;
  static constexpr int kVTileElems = kValueRows * kHeadDimBucket;
  static constexpr int kSmemBytes =
      (kQTileElems + kKTileElems + kPTileElems + kVTileElems) * int(sizeof(Acc));

  static_assert(kThreadsPerRow == 16, "row reductions use xor-shuffles within 16 lanes");
  static_assert(kBlockN % kValueRows == 0, "V tiles must split the key block evenly");
  static_assert(kKeysPerThread >= 1 && kOutColsPerThread >= 1, "tile too small for the threads");
  // Fits the default 48 KiB of every architecture we build for, so no opt-in is needed.
  static_assert(kSmemBytes <= 48 * 1024, "SIMT forward tile exceeds 48 KiB of shared memory");
};

// The kernel for narrow heads keeps the whole Q tile resident in shared memory and stages whole
// K and V tiles, prefetched into registers one key block ahead, so a key block costs four
// barriers instead of one per head-dimension chunk. K and P share one buffer: P is written only
// after every thread has finished reading K.
template <typename Acc, int kHeadDimBucket>
struct ResidentForwardConfig {
  static constexpr bool kApplies = kHeadDimBucket * int(sizeof(Acc)) <= 256;
  static constexpr int kThreads = 256;
  // Two blocks per multiprocessor caps registers at 128 per thread: 16 warps hide the latency
  // the register prefetch does not.
  static constexpr int kMinBlocks = 2;
  static constexpr int kRowGroups = 16;
  static constexpr int kThreadsPerRow = kThreads / kRowGroups;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = sizeof(Acc) == 8 ? 32 : 64;
  static constexpr int kRowsPerThread = kBlockM / kRowGroups;
  static constexpr int kKeysPerThread = kBlockN / kThreadsPerRow;
  static constexpr int kOutColsPerThread = kHeadDimBucket / kThreadsPerRow;
  static constexpr int kPad = 16 / sizeof(Acc);
  static constexpr int kStrideM = kBlockM + kPad;
  static constexpr int kStrideN = kBlockN + kPad;

  static constexpr int kQTileElems = kHeadDimBucket * kStrideM;  // (dim, query)
  static constexpr int kKTileElems = kHeadDimBucket * kStrideN;  // (dim, key)
  static constexpr int kPTileElems = kBlockN * kStrideM;         // (key, query)
  static constexpr int kKPTileElems = kKTileElems > kPTileElems ? kKTileElems : kPTileElems;
  static constexpr int kVTileElems = kBlockN * kHeadDimBucket;   // (key, dim)
  static constexpr int kSmemBytes =
      (kQTileElems + kKPTileElems + kVTileElems) * int(sizeof(Acc));

  static_assert(kThreadsPerRow == 16, "row reductions use xor-shuffles within 16 lanes");
  // The opt-in limit of the smallest target (sm_75) is 64 KiB.
  static_assert(!kApplies || kSmemBytes <= 64 * 1024, "resident tile exceeds 64 KiB");
};

}  // namespace samattn::simt
