// Internal: block-sparse calls on the Hopper forward. The block map (samattn/mask.h) lists key
// blocks per map row; a tile walks only the key blocks the map lists for any of its rows, and a
// consumer warpgroup masks, as wholly hidden, a walked block its own rows' map entry does not
// list. Which blocks those are is read from the map once per tile by the list warp (warp 2 of
// the producer warpgroup, idle otherwise), 32 key blocks per ballot, into bit masks next to the
// tile's Q buffer (KeyBlockMasks); the producer asks for them when it has the Q buffer, so the
// masks share the buffer's lifetime, and then walks the listed blocks for its copies, as the
// consumers do for their GEMMs. A byte map read one key block at a time by the producer's single
// thread would take one L2 round trip per few blocks, on the path of the next tile's first copy.
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

// How many key blocks below `block` (<= kMaxListedKeyBlocks) `words` sets.
__device__ __forceinline__ int count_listed_below(const uint32_t* words, int block) {
  int count = 0;
  for (int word = 0; word * 32 < block; ++word) {
    uint32_t bits = load_shared_word(words + word);
    if (block - word * 32 < 32) bits &= (1u << (block - word * 32)) - 1;
    count += __popc(bits);
  }
  return count;
}

__device__ __forceinline__ bool is_listed(const uint32_t* words, int block) {
  return (load_shared_word(words + block / 32) >> (block % 32)) & 1u;
}

// The producer's side: asks for tile c's masks in Q buffer q_buffer (the `index`-th request of
// the block) and waits until they are built. q_buffer < 0 tells the list warp to stop.
template <typename SharedStorage>
__device__ __forceinline__ void request_key_blocks(SharedStorage& shared, const TileCoords& c,
                                                   int q_buffer, int index) {
  publish_value(shared.list_request,
                ListRequest{c.b, c.h, c.m_begin, c.rows, c.n_first, c.n_blocks, q_buffer});
  shared.barrier_list_full.arrive();
  if (q_buffer >= 0) shared.barrier_list_empty.wait(index & 1);
}

// The list warp: one request at a time until told to stop. Per warpgroup, each lane takes key
// block 32 w + lane of every word w, the loads of kWordsPerRound words go out together (one L2
// round trip for up to 64 key blocks), and one ballot per word gives its mask; the tile's mask
// is their union. Key columns map to block map columns by integer division: supports() has
// block_k a multiple of kBlockN and block_q a multiple of 64, both bounded so that int32 holds
// them. (The producer warpgroup's few registers allow no more loads in flight.)
template <int kBlockN, int kWarpgroups, typename SharedStorage>
__device__ __forceinline__ void key_block_list_loop(const detail::ForwardKernelParams& p,
                                                    SharedStorage& shared) {
  constexpr int kWordsPerRound = 2;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int index = 0;; ++index) {
    shared.barrier_list_full.wait(index & 1);
    const ListRequest r = published_value<ListRequest>(shared.list_request);
    if (r.q_buffer < 0) return;
    KeyBlockMasks<kWarpgroups>& masks = shared.key_blocks[r.q_buffer];
    for (int w = 0; w < kWarpgroups; ++w) {
      const int32_t first_row = r.m_begin + 64 * w;
      const bool has_rows = first_row < r.m_begin + r.rows;
      const uint8_t* row =
          p.block_map + int64_t{r.b} * p.block_batch_stride + int64_t{r.h} * p.block_head_stride +
          int64_t{first_row / static_cast<int32_t>(p.block_q)} * p.block_row_stride;
      for (int word0 = 0; word0 < kKeyBlockWords; word0 += kWordsPerRound) {
        bool listed[kWordsPerRound];
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          const int32_t n = (word0 + u) * 32 + lane;
          const int32_t column = n * kBlockN / static_cast<int32_t>(p.block_k);
          listed[u] = has_rows && n >= r.n_first && n < r.n_first + r.n_blocks &&
                      __ldg(row + column * p.block_col_stride) != 0;
        }
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          const uint32_t bits = __ballot_sync(0xffffffffu, listed[u]);
          if (lane == 0) masks.rows[w][word0 + u] = bits;
        }
      }
    }
    __syncwarp();
    // The tile's mask: lane i < kKeyBlockWords unites word i of the warpgroups' masks (written
    // by lane 0; __syncwarp orders those stores before these loads).
    if (lane < kKeyBlockWords) {
      uint32_t any = 0;
      CUTE_UNROLL
      for (int w = 0; w < kWarpgroups; ++w) any |= masks.rows[w][lane];
      masks.tile[lane] = any;
    }
    // Every lane arrives (the barrier expects 32), each after its own stores; the producer's
    // wait completes only after all of them.
    shared.barrier_list_empty.arrive();
  }
}

}  // namespace samattn::hopper
