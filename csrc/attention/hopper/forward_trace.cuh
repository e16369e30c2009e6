// Internal: an optional timeline of the Hopper forward, for finding where a tile's time goes (the
// tile-boundary cost at short key sequences). Compiled in only by a diagnostic build (cmake
// -DSAMATTN_HOPPER_TRACE=ON, never the library's default): one thread per role (the producer's
// TMA thread, the first thread of each consumer warpgroup) stamps each event with the SM's
// clock64 into its own lane of a device buffer, and the launcher writes the buffer to the file
// named by SAMATTN_HOPPER_TRACE_FILE after each call (benchmarks/trace_hopper_forward.py reads
// it). Without the option TraceWriter is empty and the kernel's code is unchanged.
#pragma once

#include <cstdint>

namespace samattn::hopper {

// What happened; the record also carries the tile (the role's tile count) and a key block.
enum class TraceEvent : uint32_t {
  // Consumer warpgroup.
  kTileStart = 1,     // its Q has landed and the tile is known (block: the tile's key blocks)
  kFirstSLanded,      // the first S GEMM of the tile has landed
  kFirstSoftmaxDone,  // its softmax and P conversion are done
  kTurnTaken,         // a ping-pong turn begins (block: the key block of its S GEMM)
  kGemmsIssued,       // both GEMMs of the turn are issued (their K and V had landed)
  kSLanded,           // the turn's S GEMM has landed
  kSoftmaxDone,       // its softmax is done
  kPVLanded,          // the turn's P V GEMM has landed
  kIterationDone,     // O rescaled, P converted
  kLastPVLanded,      // the tile's last P V GEMM has landed
  kEpilogueDone,      // O and lse written (or handed to the copy engine)
  // Producer's TMA thread.
  kUnitTaken,  // the scheduler's next unit is read
  kKIssued,    // a K stage was free and its copy is issued (block: the key block)
  kVIssued,    // the same for V
  kQIssued,    // a Q buffer was free and its copy is issued
  // Consumer warpgroup, inside the phases above.
  kQLanded,        // the wait for the next tile's Q (and its published tile) returned
  kFirstKLanded,   // the wait for the tile's first K returned
  kStoreReleased,  // the previous tile's staged output is read (its Q buffer released)
  kOStaged,        // the normalised O is in shared memory (this thread's part)
  kOStageSynced,   // the proxy fence and the warpgroup's named barrier are done
  kOStoreIssued,   // the TMA store of O is issued
  // Producer's TMA thread, block-sparse calls (forward_key_blocks.cuh).
  kListRequested,  // the tile's key-block masks are asked of the list warp
  kListReady,      // the list warp has built them
};

// The trace file's first word ("SAMTRACE"; benchmarks/trace_hopper_forward.py checks it).
inline constexpr int64_t kTraceMagic = 0x53414d5452414345;

// The device buffer: for each block and lane, `capacity` records of two words (clock64, then
// event << 48 | tile << 16 | key block).
struct ForwardTrace {
  unsigned long long* records;
  int lanes;
  int capacity;
};

#if defined(SAMATTN_HOPPER_TRACE)
class TraceWriter {
 public:
  // params: HopperForwardParams (its `trace` member exists only in this build).
  template <typename Params>
  __device__ TraceWriter(const Params& params, int lane, bool writes)
      : left_(params.trace.capacity) {
    const int64_t first = (int64_t{blockIdx.x} * params.trace.lanes + lane) * params.trace.capacity;
    next_ = writes && params.trace.records != nullptr ? params.trace.records + 2 * first : nullptr;
  }
  __device__ void operator()(TraceEvent event, int tile, int block) {
    if (next_ == nullptr || left_ == 0) return;
    next_[0] = clock64();
    next_[1] = (static_cast<unsigned long long>(event) << 48) |
               (static_cast<unsigned long long>(static_cast<uint32_t>(tile)) << 16) |
               static_cast<uint16_t>(block);
    next_ += 2;
    --left_;
  }

 private:
  unsigned long long* next_;
  int left_;
};
#else
class TraceWriter {
 public:
  template <typename Params>
  __device__ __forceinline__ TraceWriter(const Params&, int, bool) {}
  __device__ __forceinline__ void operator()(TraceEvent, int, int) const {}
};
#endif

}  // namespace samattn::hopper
