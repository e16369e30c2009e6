// Internal: block-sparse calls on the Hopper forward. The block map (samattn/mask.h) lists key
// blocks per map row; a tile walks only the key blocks the map lists for any of its rows, and a
// consumer warpgroup masks, as wholly hidden, a walked block its own rows' map entry does not
// list. Which blocks those are is read from the map once per tile by the list warp (warp 2 of
// the producer warpgroup, idle otherwise), 32 key blocks per ballot, into bit masks next to the
// tile's Q buffer (KeyBlockMasks); the producer asks for them when it has the Q buffer, so the
// masks share the buffer's lifetime, and before it has the tile's coordinates, which the list
// warp finds too, so that the two run at once; it then walks the listed blocks for its copies,
// as the consumers do for their GEMMs. A byte map read one key block at a time by the producer's
// single thread would take one L2 round trip per few blocks, on the path of the next tile's first
// copy.
#pragma once

#include "attention/hopper/forward_traits.cuh"

namespace samattn::hopper {

// Shared-memory reads of what another thread wrote before a barrier this one has waited on: the
// memory clobber keeps them after the wait (CUTLASS's mbarrier asm has none).
__device__ __forceinline__ uint32_t load_shared_word(const uint32_t* word) {
  uint32_t value;
  asm volatile("ld.volatile.shared.u32 %0, [%1];"
               : "=r"(value)
               : "r"(cute::cast_smem_ptr_to_uint(word))
               : "memory");
  return value;
}

// The highest key block below `block` whose bit `words` sets (the caller knows there is one).
__device__ __forceinline__ int listed_below(const uint32_t* words, int block) {
  int word = (block - 1) / 32;
  uint32_t bits = load_shared_word(words + word) & (0xffffffffu >> (31 - (block - 1) % 32));
  while (bits == 0) bits = load_shared_word(words + --word);
  return word * 32 + 31 - __clz(bits);
}

// How many key blocks of [first, end) `words` sets (end - first <= kMaxListedKeyBlocks). Only
// the words of the tile's key-block range are written for a tile (key_block_list_loop): the
// others hold an earlier tile's bits.
__device__ __forceinline__ int count_listed(const uint32_t* words, int first, int end) {
  int count = 0;
  for (int word = first / 32; word * 32 < end; ++word) {
    uint32_t bits = load_shared_word(words + word);
    if (end - word * 32 < 32) bits &= (1u << (end - word * 32)) - 1;
    count += __popc(bits);
  }
  return count;
}

__device__ __forceinline__ bool is_listed(const uint32_t* words, int block) {
  return (load_shared_word(words + block / 32) >> (block % 32)) & 1u;
}

// The producer's side: asks for the masks of tile `half` of unit `unit` in Q buffer q_buffer
// (which it has acquired); q_buffer < 0 tells the list warp to stop. The producer goes on to
// the tile's coordinates while the list warp builds them, then waits (wait_key_blocks).
template <typename SharedStorage>
__device__ __forceinline__ void request_key_blocks(SharedStorage& shared, int32_t unit, int half,
                                                   int q_buffer) {
  publish_value(shared.list_request, ListRequest{unit, half, q_buffer});
  shared.barrier_list_full.arrive();
}

// Waits for the masks of the `index`-th request of the block.
template <typename SharedStorage>
__device__ __forceinline__ void wait_key_blocks(SharedStorage& shared, int index) {
  shared.barrier_list_empty.wait(index & 1);
}

// The list warp's loop (key_block_list_loop below), with column_of(n) the block map column of
// key block n.
template <int kBlockM, int kBlockN, int kWarpgroups, typename Params, typename SharedStorage,
          typename ColumnOf>
__device__ __forceinline__ void serve_key_block_requests(const Params& params,
                                                         SharedStorage& shared,
                                                         ColumnOf column_of) {
  const detail::ForwardKernelParams& p = params.p;
  constexpr int kWordsPerRound = 2;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int index = 0;; ++index) {
    shared.barrier_list_full.wait(index & 1);
    const ListRequest request = published_value<ListRequest>(shared.list_request);
    if (request.q_buffer < 0) return;
    const TileCoords r = tile_coords<kBlockM, kBlockN>(
        params.geometry, params.schedule.tile(request.unit, request.half));
    KeyBlockMasks<kWarpgroups>& masks = shared.key_blocks[request.q_buffer];
    // A tile past its sequence's end (rows <= 0) has no key block: nothing to write.
    const int32_t n_end = r.n_first + r.n_blocks;
    const int word_first = r.n_first / 32;
    const int word_end = r.n_blocks > 0 ? (n_end - 1) / 32 + 1 : word_first;
    for (int w = 0; w < kWarpgroups; ++w) {
      const int32_t first_row = r.m_begin + 64 * w;
      const bool has_rows = first_row < r.m_begin + r.rows;
      const uint8_t* row =
          p.block_map + int64_t{r.b} * p.block_batch_stride + int64_t{r.h} * p.block_head_stride +
          int64_t{first_row / static_cast<int32_t>(p.block_q)} * p.block_row_stride;
      for (int word0 = word_first; word0 < word_end; word0 += kWordsPerRound) {
        bool listed[kWordsPerRound];
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          const int32_t n = (word0 + u) * 32 + lane;
          listed[u] = has_rows && n >= r.n_first && n < n_end &&
                      __ldg(row + int64_t{column_of(n)} * p.block_col_stride) != 0;
        }
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          const uint32_t bits = __ballot_sync(0xffffffffu, listed[u]);
          if (lane == 0 && word0 + u < word_end) masks.rows[w][word0 + u] = bits;
        }
      }
    }
    __syncwarp();
    // The tile's mask: lane i of the range unites word i of the warpgroups' masks (written by
    // lane 0; __syncwarp orders those stores before these loads).
    if (lane >= word_first && lane < word_end) {
      uint32_t any = 0;
      CUTE_UNROLL
      for (int w = 0; w < kWarpgroups; ++w) any |= masks.rows[w][lane];
      masks.tile[lane] = any;
    }
    // Every lane arrives (the barriers expect 32), each after its own stores; the producer's
    // and the consumers' waits complete only after all of them. The consumers open only the
    // tiles with rows (the producer publishes no other), so only those complete a phase of
    // their Q buffer's barrier.
    if (r.rows > 0) shared.barrier_masks_full[request.q_buffer].arrive();
    shared.barrier_list_empty.arrive();
  }
}

// The list warp: one request at a time until told to stop. It writes only the words of the
// tile's key-block range: walking all kKeyBlockWords words took ~800 instructions a request
// for the ~4 words of a 16k-key tile, ~6.7k cycles on the next tile's path (stop 35's trace).
// Per warpgroup, each lane takes key block 32 w + lane of every word w, the loads of
// kWordsPerRound words go out together, and one ballot per word gives its mask; the tile's
// mask is their union. Key columns map to block map columns by integer division, skipped in
// the usual case of one key block a column: supports() has block_k a multiple of kBlockN and
// block_q a multiple of 64, both bounded so that int32 holds them. (The producer warpgroup's
// few registers allow no more loads in flight.)
template <int kBlockM, int kBlockN, int kWarpgroups, typename Params, typename SharedStorage>
__device__ __forceinline__ void key_block_list_loop(const Params& params, SharedStorage& shared) {
  const int32_t blocks_per_column = static_cast<int32_t>(params.p.block_k) / kBlockN;
  if (blocks_per_column == 1) {
    serve_key_block_requests<kBlockM, kBlockN, kWarpgroups>(params, shared,
                                                            [](int32_t n) { return n; });
  } else {
    serve_key_block_requests<kBlockM, kBlockN, kWarpgroups>(
        params, shared, [blocks_per_column](int32_t n) { return n / blocks_per_column; });
  }
}

}  // namespace samattn::hopper
