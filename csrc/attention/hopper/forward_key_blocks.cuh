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

// The list warp: one request at a time until told to stop. Each lane takes key block 32 u + lane
// of every word u; the loads of a round's words go out together (one L2 round trip), and one
// ballot per word gives its mask; the tile's mask is the warpgroups' union. A map row is read
// once for every warpgroup whose rows lie in it (a 128-row block_q covers two), four words (128
// key blocks) per round; with batched = false (the ablation per_warpgroup_map_reads), once per
// warpgroup and two words per round. Key columns map to block map columns by integer division:
// supports() has block_k a multiple of kBlockN and block_q a multiple of 64 (so a warpgroup's
// 64 rows lie in one map row), both bounded so that int32 holds them.
template <int kBlockN, int kWarpgroups, typename SharedStorage>
__device__ __forceinline__ void key_block_list_loop(const detail::ForwardKernelParams& p,
                                                    bool batched, SharedStorage& shared) {
  constexpr int kWordsPerRound = 4;
  const int words_per_round = batched ? kWordsPerRound : 2;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int32_t block_q = static_cast<int32_t>(p.block_q);
  const int32_t blocks_per_column = static_cast<int32_t>(p.block_k) / kBlockN;
  for (int index = 0;; ++index) {
    shared.barrier_list_full.wait(index & 1);
    const ListRequest r = published_value<ListRequest>(shared.list_request);
    if (r.q_buffer < 0) return;
    KeyBlockMasks<kWarpgroups>& masks = shared.key_blocks[r.q_buffer];
    const int32_t rows_end = r.m_begin + r.rows;
    for (int w = 0; w < kWarpgroups;) {
      const int32_t first_row = r.m_begin + 64 * w;
      const bool has_rows = first_row < rows_end;
      // Warpgroups w .. w + sharing - 1 read map row first_row / block_q.
      int sharing = 1;
      while (batched && has_rows && w + sharing < kWarpgroups &&
             first_row + 64 * sharing < rows_end &&
             (first_row + 64 * sharing) / block_q == first_row / block_q) {
        ++sharing;
      }
      const uint8_t* row = p.block_map + int64_t{r.b} * p.block_batch_stride +
                           int64_t{r.h} * p.block_head_stride +
                           int64_t{first_row / block_q} * p.block_row_stride;
      for (int word0 = 0; word0 < kKeyBlockWords; word0 += words_per_round) {
        bool in_range[kWordsPerRound];
        const uint8_t* entry[kWordsPerRound];
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          const int32_t n = (word0 + u) * 32 + lane;
          in_range[u] =
              u < words_per_round && has_rows && n >= r.n_first && n < r.n_first + r.n_blocks;
          entry[u] = row + int64_t{n / blocks_per_column} * p.block_col_stride;
        }
        bool listed[kWordsPerRound] = {};
        if (batched) {
          // Rounds past the tile's key blocks only clear their words. Otherwise every lane
          // loads (out of range: the map's first byte) before any value is tested, so that the
          // round's loads go out together instead of each behind a branch on the one before.
          const bool round_has_keys = has_rows && word0 * 32 < r.n_first + r.n_blocks &&
                                      (word0 + words_per_round) * 32 > r.n_first;
          if (round_has_keys) {
            uint8_t value[kWordsPerRound];
            CUTE_UNROLL
            for (int u = 0; u < kWordsPerRound; ++u) {
              value[u] = __ldg(in_range[u] ? entry[u] : p.block_map);
            }
            CUTE_UNROLL
            for (int u = 0; u < kWordsPerRound; ++u) listed[u] = in_range[u] && value[u] != 0;
          }
        } else {
          CUTE_UNROLL
          for (int u = 0; u < kWordsPerRound; ++u) listed[u] = in_range[u] && __ldg(entry[u]) != 0;
        }
        CUTE_UNROLL
        for (int u = 0; u < kWordsPerRound; ++u) {
          if (u >= words_per_round) break;
          const uint32_t bits = __ballot_sync(0xffffffffu, listed[u]);
          if (lane == 0) {
            for (int s = 0; s < sharing; ++s) masks.rows[w + s][word0 + u] = bits;
          }
        }
      }
      w += sharing;
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
