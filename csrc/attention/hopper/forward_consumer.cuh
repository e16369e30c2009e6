// Internal: the consumers of the Hopper forward. Consumer warpgroup w owns query rows
// [64 w, 64 w + 64) of every tile its block takes (the producer's order). Per key block:
//   S = Q K^T (wgmma, both operands in shared memory, fp32 accumulators in registers)
//   -> online softmax with one FFMA + exp2 per raw score (masking only on blocks that cross the
//      end of the keys, the causal diagonal or a window's ends; ForwardTile::one_softmax_copy)
//   -> O += P V (wgmma, P rounded to the operand type and fed from registers as the A operand:
//      the accumulator fragment of S is already the A fragment layout).
// Within a warpgroup the softmax of block j overlaps the tensor cores' O += P_{j-1} V_{j-1}: both
// GEMMs are issued back to back and only S_j is waited for. Across warpgroups, named barriers
// pass a turn around (ping-pong): a warpgroup issues its GEMM pair only in its turn, so one
// warpgroup's softmax runs while the other's GEMMs hold the tensor cores. The output is
// normalised in registers, staged in shared memory and stored by TMA (the warpgroup goes on to
// its next tile, whose Q and first K/V the producer has already loaded).
#pragma once

#include "attention/hopper/forward_key_blocks.cuh"
#include "attention/hopper/forward_softmax.cuh"
#include "attention/hopper/forward_traits.cuh"
#include "attention/hopper/wgmma_utils.cuh"

namespace samattn::hopper {

// Named barrier ids 1 .. consumer warpgroups: warpgroup w waits on kFirstTurnBarrier + w, and the
// warpgroup before it (cyclically) arrives there when its turn ends.
inline constexpr int kFirstTurnBarrier = 1;

template <int kConsumerWarpgroups>
struct TurnBarrier {
  int warpgroup;                            // 0 .. kConsumerWarpgroups - 1
  bool enabled;                             // false: no turns (ForwardKernelOptions::pingpong)
  static constexpr int kThreads = 2 * 128;  // the waiting warpgroup and the one arriving

  // Warpgroup 0 takes the first turn: the last warpgroup hands it over before any tile.
  __device__ __forceinline__ void start() const {
    if (enabled && warpgroup == kConsumerWarpgroups - 1) {
      named_barrier_arrive(kFirstTurnBarrier, kThreads);
    }
  }
  __device__ __forceinline__ void wait() const {
    if (enabled) named_barrier_sync(kFirstTurnBarrier + warpgroup, kThreads);
  }
  __device__ __forceinline__ void pass() const {
    const int next = warpgroup + 1 == kConsumerWarpgroups ? 0 : warpgroup + 1;
    if (enabled) named_barrier_arrive(kFirstTurnBarrier + next, kThreads);
  }
};

template <typename Element, int kHeadDim, int kVariant>
__device__ __forceinline__ void consumer_loop(
    const HopperForwardParams<Element, kHeadDim, kVariant>& params,
    typename KernelTraits<Element, kHeadDim, kVariant>::SharedStorage& shared,
    typename KernelTraits<Element, kHeadDim, kVariant>::Pipeline& pipeline_k,
    typename KernelTraits<Element, kHeadDim, kVariant>::Pipeline& pipeline_v) {
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim, kVariant>;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr bool kLeanTileStart = Traits::kTile.lean_tile_start;
  constexpr bool kHoistedLimits = Traits::kTile.hoisted_limits;
  constexpr bool kOneSoftmaxCopy = Traits::kTile.one_softmax_copy;
  const detail::ForwardKernelParams& p = params.p;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0 .. kConsumerThreads - 1
  const int lane = tid % 32;
  // Broadcast from lane 0 so the compiler knows it is warp-uniform: everything derived from it
  // (the shared-memory descriptors of the wgmma operands above all) then lives in uniform
  // registers instead of taking per-thread ones.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  const TurnBarrier<Traits::kConsumerWarpgroups> turn{warpgroup, params.options.pingpong};

  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  // The operand descriptors are the same for every thread of a warpgroup: slice at its first.
  auto warpgroup_s = mma_s.get_thread_slice(warpgroup * 128);
  auto warpgroup_o = mma_o.get_thread_slice(warpgroup * 128);
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = warpgroup_s.partition_fragment_A(sQ);    // (MMA, 1, K, Q buffer) descriptors
  Tensor tSrK = warpgroup_s.partition_fragment_B(sK);    // (MMA, 1, K, stage)
  Tensor tOrVt = warpgroup_o.partition_fragment_B(sVt);  // (MMA, 1, N/16, stage)
  Tensor tSrS =
      partition_fragment_C(mma_s, Shape<typename Traits::BlockM, typename Traits::BlockN>{});
  Tensor tOrO =
      partition_fragment_C(mma_o, Shape<typename Traits::BlockM, typename Traits::HeadDim>{});
  // A tile's narrow first block (ForwardKernelOptions::narrow_first_block): its softmax takes
  // only the scores of the block's first kNarrowBlockN keys, the first values of tSrS (their
  // column groups are its outermost values; the accumulator is compact). The S GEMM stays the
  // whole block's: a narrower wgmma next to it made ptxas serialise the kernel's wgmmas (C7515).
  Tensor tSrS_narrow =
      make_tensor(tSrS.data(), make_layout(Int<size(tSrS) * Traits::kNarrowBlockN / kBlockN>{}));
  static_assert(cute::is_same_v<decltype(coalesce(tSrS.layout())), Layout<Int<size(tSrS)>, _1>>,
                "the narrow block's scores are a prefix of the block's");
  Tensor tOrP = make_tensor<Element>(accumulator_as_a_operand(tSrS.layout()));
  static_assert(size(tOrP) == size(tSrS), "P reuses the S fragment's order");
  static_assert(size<2>(tOrP) == kBlockN / 16, "one P k-block per 16 keys");
  // (row, column) of every accumulator element within the block's tile.
  Tensor tScS = thr_s.partition_C(
      make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::BlockN>{}));
  Tensor tOcO = mma_o.get_thread_slice(tid).partition_C(
      make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
  // A thread holds two rows of its warp's 16: element i of an accumulator is in row half
  // (i / 2) % 2 (wgmma's fragment order: column pair, row half, 8-column group).
  const int local_row[2] = {get<0>(tScS(0)), get<0>(tScS(2))};
  const int warpgroup_first_row = 64 * warpgroup;
  uint32_t* p_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));

  // Block-sparse: the tile walks the key blocks the map lists (forward_key_blocks.cuh).
  const bool sparse = p.block_map != nullptr;
  const float scale_log2 = static_cast<float>(p.scale_log2);
  // The fused FFMA needs the max of the raw scores to be the max of the scaled ones.
  const bool fuse_scale = scale_log2 > 0.f;
  RowSoftmax softmax;
  // O through shared memory: each warpgroup writes its rows into its own rows of the tile's Q
  // buffer (free once its last S GEMM is done) and one of its threads hands them to the copy
  // engine as a TMA store, so the warpgroup goes on to its next tile without issuing a global
  // store (ncu at 8 key blocks per tile: 4-byte stores from registers filled the store queue,
  // and 16-byte stores read back from shared memory still took the warps' time; NOTES.md). The
  // Q buffer is released once the copy engine has read it, which the storing thread checks
  // after its next tile's first block: with one Q buffer that would hold back the next tile's
  // Q, so two buffers only. Not with three consumer warpgroups either: under their 128-register
  // launch bound ptxas spilled 64 bytes. supports() has required TMA-compatible O strides.
  constexpr bool kCanStageO = Traits::kQBuffers > 1 && Traits::kConsumerWarpgroups == 2;
  // A varlen tile's last rows belong to the next sequence, which a TMA store (clipped only at
  // the tensor's end) would overwrite: varlen stores from registers, row by row, as does an fp32
  // output (the fixed pattern's summary part).
  const bool stage_o = kCanStageO && params.options.staged_store &&
                       params.geometry.cu_seqlens_q == nullptr && !p.out_is_float;
  // The named barrier of warpgroup w's staged output, after the turns' ids.
  const int stage_o_barrier = kFirstTurnBarrier + Traits::kConsumerWarpgroups + warpgroup;
  const bool stores_o = tid % 128 == 0;  // the thread that issues its warpgroup's TMA store
  int stored_q_buffer = -1;  // the Q buffer of this warpgroup's last TMA store not yet released
  // The storing thread's release of that buffer, once the copy engine has read it (the other
  // threads released it after staging).
  auto release_stored_q_buffer = [&]() {
    if (stored_q_buffer < 0) return;
    if (stores_o) {
      tma_store_wait<0>();
      shared.barrier_q_empty[stored_q_buffer].arrive();
    }
    stored_q_buffer = -1;
  };
  // Lane 0 of the trace is the producer; consumer warpgroup w is lane w + 1.
  TraceWriter trace(params, warpgroup + 1, tid % 128 == 0);
  typename Traits::PipelineState state;
  turn.start();

  // One tile as this warpgroup works on it. The producer's order: tile i is in Q buffer
  // i % kQBuffers (publish_tile).
  struct TileState {
    int iteration, q_buffer;
    TileCoords c;
    // The key blocks whose scores need masking: from first_masked_block up, and below
    // first_unclipped_block.
    int first_masked_block, first_unclipped_block;
    int tile_blocks;    // the key blocks the tile walks (all of them, or the listed ones)
    int own_key_end;    // one past the last key this warpgroup's rows see (warpgroup_key_end)
    int own_end_block;  // one past the last key block this warpgroup's rows see
    int own_blocks;     // how many of the walked blocks this warpgroup computes
    int key_block;      // the first (highest) of them, whose S GEMM start_tile issues
    // The warpgroup's rows see only key_block's first kNarrowBlockN keys (narrow_first_block).
    bool narrow;
    // With ForwardTile::hoisted_limits and no window: one past the last key each of the
    // thread's two rows sees (row_key_end).
    int key_end[2];
  };
  TileState cur{};
  // Tile t's sequence (see sequence_geometry: read where needed, not kept).
  auto geometry = [&](const TileState& t) { return sequence_geometry(params.geometry, t.c.b); };
  // The tile's key blocks (all of [n_first, n_first + n_blocks), or the listed ones) and the
  // next one down, from one past the last.
  auto next_key_block = [&](const TileState& t, int block) {
    return sparse ? listed_below(shared.key_blocks[t.q_buffer].tile, block) : block - 1;
  };
  auto hidden_block = [&](int block) {
    return sparse && !is_listed(shared.key_blocks[cur.q_buffer].rows[warpgroup], block);
  };

  // The key blocks of tile t whose scores need masking (found under the tile's first GEMM with a
  // lean tile start).
  auto find_masked_blocks = [&](TileState& t) {
    t.first_masked_block =
        first_masked_key_block<kBlockN>(geometry(t), t.c.m_begin + warpgroup_first_row);
    t.first_unclipped_block =
        first_unclipped_key_block<kBlockN>(geometry(t), t.c.m_begin + warpgroup_first_row + 63);
    if constexpr (kHoistedLimits) {
      const TileGeometry g = geometry(t);
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = min(t.c.m_begin + local_row[r], g.seqlen_q - 1);  // rows past: unused
        t.key_end[r] = row_key_end(g, row);
      }
    }
  };

  // Waits for tile `iteration`'s Q and returns false at the end of the block's work; otherwise
  // reads the tile and counts the key blocks it walks and this warpgroup computes.
  auto open_tile = [&](int iteration, TileState& t) {
    t.iteration = iteration;
    t.q_buffer = iteration % Traits::kQBuffers;
    shared.barrier_q_full[t.q_buffer].wait((iteration / Traits::kQBuffers) & 1);
    trace(TraceEvent::kQLanded, iteration, t.q_buffer);
    const ScheduledTile tile = published_tile(shared.q_tile[t.q_buffer]);
    if (tile.unit < 0) return false;
    if constexpr (kLeanTileStart) {
      t.c = published_value<TileCoords>(shared.q_tile_coords[t.q_buffer]);
    } else {
      t.c = tile_coords<Traits::kBlockM, kBlockN>(params.geometry,
                                                  params.schedule.tile(tile.unit, tile.half));
    }
    const TileCoords& c = t.c;
    // Block-sparse: the Q copy may land before the list warp has built the tile's masks.
    if (sparse) {
      shared.barrier_masks_full[t.q_buffer].wait((iteration / Traits::kQBuffers) & 1);
    }
    trace(TraceEvent::kTileStart, iteration, c.n_blocks);
    if constexpr (!kLeanTileStart) find_masked_blocks(t);
    const uint32_t* tile_mask = shared.key_blocks[t.q_buffer].tile;
    t.tile_blocks =
        sparse ? count_listed(tile_mask, c.n_first, c.n_first + c.n_blocks) : c.n_blocks;
    t.own_key_end = warpgroup_key_end(geometry(t), c, c.m_begin + warpgroup_first_row);
    t.own_end_block = c.n_first + warpgroup_key_blocks<kBlockN>(c, t.own_key_end);
    t.own_blocks =
        sparse ? count_listed(tile_mask, c.n_first, t.own_end_block) : t.own_end_block - c.n_first;
    return true;
  };

  // The tile's highest key blocks may lie past every diagonal (or window end) of this
  // warpgroup's rows, and a warpgroup whose rows all lie past the sequence's end sees none: it
  // passes those stages on without a GEMM (192-row tiles of 128-key blocks at causal S = 1k: a
  // quarter of the GEMMs). It still waits for each stage to land, so that its release can only
  // complete the phase the stage is in, and it keeps every turn of the tile (one per block after
  // the first), so the turns of all warpgroups stay in step. Then, if it sees any block, it waits
  // for the first one's K and issues the tile's first S GEMM.
  auto start_tile = [&](TileState & t) __attribute__((always_inline)) {
    // A warpgroup that computes at most one of the tile's blocks releases the previous tile's
    // staged buffer now, not after its first block: the producer's lookahead waits for that
    // buffer after the K of the tile's second-to-last block, and such a warpgroup would otherwise
    // wait first for later stages (the ones it passes on, or its only block's K): a deadlock the
    // protocol model found (tests/emulation/hopper_forward_pipeline.py; e.g. S = 1050 at head dim
    // 128, whose last tile's upper warpgroup has no row).
    if (t.own_blocks < 2) release_stored_q_buffer();
    const int idle_turns = t.tile_blocks - max(t.own_blocks, 1);
    for (int skipped = 0; skipped < t.tile_blocks - t.own_blocks; ++skipped) {
      pipeline_k.consumer_wait(state);
      pipeline_k.consumer_release(state);
      pipeline_v.consumer_wait(state);
      pipeline_v.consumer_release(state);
      ++state;
      if (skipped < idle_turns) {
        turn.wait();
        turn.pass();
      }
    }
    if (t.own_blocks > 0) {
      t.key_block = next_key_block(t, t.own_end_block);
      t.narrow = Traits::kNarrowFirstBlock && params.options.narrow_first_block &&
                 t.own_key_end - t.key_block * kBlockN <= Traits::kNarrowBlockN;
      pipeline_k.consumer_wait(state);
      trace(TraceEvent::kFirstKLanded, t.iteration, t.own_blocks - 1);
      Tensor tSrQ_tile = tSrQ(_, _, _, t.q_buffer);
      warpgroup_gemm</*kAInRegisters=*/false, /*kWait=*/false>(
          mma_s, tSrQ_tile, tSrK(_, _, _, state.index()), tSrS, /*zero_init=*/true);
      if constexpr (kLeanTileStart) find_masked_blocks(t);
      // Waited for here: a wait in run_tile made ptxas serialise every wgmma of the kernel.
      warpgroup_wait<0>();
      finish_operands(tSrS);
    }
  };

  // Scores of key block n_block (counted from key 0, in s: tSrS, or tSrS_narrow for its first
  // keys) -> probabilities; rescale as in RowSoftmax. hidden: the block map does not list the
  // block for this warpgroup's rows.
  auto softmax_block = [&](auto& s, int n_block, bool hidden, float(&rescale)[2]) {
    const bool needs_mask =
        hidden || n_block >= cur.first_masked_block || n_block < cur.first_unclipped_block;
    // Two bodies with the same masks (ForwardTile::one_softmax_copy), each written as it was
    // measured: a shared mask helper changed ptxas's register choices in both kernels, and
    // sass-report shows these bodies compile to the measured kernels' SASS (d19edaf, a592f08).
    if constexpr (kOneSoftmaxCopy) {
      // Masked blocks go through the fused FFMA as unmasked ones do: their raw scores are masked
      // (-inf stays -inf under a positive scale), which saves a multiply per score, and a call
      // site inlines one copy of the softmax, not one per mask branch (sass-report: fwd:64:1 8040
      // -> 7328 instructions). With a scale <= 0 (whose product would reorder the max), or the
      // scaled_mask ablation on a masked block, the scores are scaled first and the softmax runs
      // with scale 1.
      const bool scale_first = !fuse_scale || (needs_mask && !params.options.lean_mask);
      if (scale_first) {
        CUTE_UNROLL
        for (int i = 0; i < size(s); ++i) s(i) *= scale_log2;
      }
      if (needs_mask) {
        const TileGeometry g = geometry(cur);
        if (g.windowed) {
          int low[2], limit[2];  // this block's visible columns of each row: [low, limit)
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            const int row = min(cur.c.m_begin + local_row[r], g.seqlen_q - 1);  // rows past: unused
            const detail::Span span = window_key_span(g, row);
            const int64_t block_begin = int64_t{n_block} * kBlockN;
            low[r] =
                static_cast<int>(max(int64_t{0}, min(span.begin - block_begin, int64_t{kBlockN})));
            limit[r] = hidden ? 0
                              : static_cast<int>(
                                    max(int64_t{0}, min(span.end - block_begin, int64_t{kBlockN})));
          }
          CUTE_UNROLL
          for (int i = 0; i < size(s); ++i) {
            const int column = get<1>(tScS(i));
            if (column >= limit[(i / 2) % 2] || column < low[(i / 2) % 2]) s(i) = -INFINITY;
          }
        } else {
          int limit[2];
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            if constexpr (kHoistedLimits) {
              limit[r] = hidden ? 0 : max(0, min(cur.key_end[r] - n_block * kBlockN, kBlockN));
            } else {
              const int row = min(cur.c.m_begin + local_row[r], g.seqlen_q - 1);  // rows past
              limit[r] = hidden ? 0 : max(0, min(row_key_end(g, row) - n_block * kBlockN, kBlockN));
            }
          }
          CUTE_UNROLL
          for (int i = 0; i < size(s); ++i) {
            if (get<1>(tScS(i)) >= limit[(i / 2) % 2]) s(i) = -INFINITY;
          }
        }
      }
      softmax.update(s, scale_first ? 1.f : scale_log2, rescale);
    } else {
      if (!needs_mask && fuse_scale) {
        softmax.update(s, scale_log2, rescale);
        return;
      }
      const TileGeometry g = geometry(cur);
      // A window's masked blocks (two of a tile's three at a 256-key window) go through the fused
      // FFMA: their raw scores are masked (-inf stays -inf under a positive scale), not scaled
      // first, which saves a multiply per score (window 256's trace at 5264b1c: masked softmaxes
      // 2.7-3.0k cycles, unmasked ones 1.6k).
      const bool fused_mask = g.windowed && fuse_scale && params.options.lean_mask;
      if (!fused_mask) {
        CUTE_UNROLL
        for (int i = 0; i < size(s); ++i) s(i) *= scale_log2;
      }
      if (needs_mask && g.windowed) {
        int low[2], limit[2];  // this block's visible columns of each row: [low, limit)
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int row = min(cur.c.m_begin + local_row[r], g.seqlen_q - 1);  // rows past: unused
          const detail::Span span = window_key_span(g, row);
          const int64_t block_begin = int64_t{n_block} * kBlockN;
          low[r] =
              static_cast<int>(max(int64_t{0}, min(span.begin - block_begin, int64_t{kBlockN})));
          limit[r] = hidden ? 0
                            : static_cast<int>(
                                  max(int64_t{0}, min(span.end - block_begin, int64_t{kBlockN})));
        }
        CUTE_UNROLL
        for (int i = 0; i < size(s); ++i) {
          const int column = get<1>(tScS(i));
          if (column >= limit[(i / 2) % 2] || column < low[(i / 2) % 2]) s(i) = -INFINITY;
        }
      } else if (needs_mask) {
        int limit[2];
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          if constexpr (kHoistedLimits) {
            limit[r] = hidden ? 0 : max(0, min(cur.key_end[r] - n_block * kBlockN, kBlockN));
          } else {
            const int row = min(cur.c.m_begin + local_row[r], g.seqlen_q - 1);  // rows past: unused
            limit[r] = hidden ? 0 : max(0, min(row_key_end(g, row) - n_block * kBlockN, kBlockN));
          }
        }
        CUTE_UNROLL
        for (int i = 0; i < size(s); ++i) {
          if (get<1>(tScS(i)) >= limit[(i / 2) % 2]) s(i) = -INFINITY;
        }
      }
      softmax.update(s, fused_mask ? scale_log2 : 1.f, rescale);
    }
  };
  // P from the scores s (tSrS, or tSrS_narrow: the block's first keys, the rest P = 0).
  auto convert_p = [&](const auto& s) {
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS) / 2; ++i) {
      p_pairs[i] = 2 * i < size(s) ? pack_pair<Element>(s(2 * i), s(2 * i + 1)) : 0u;
    }
  };

  // Normalises tile t's output and stores the rows inside the tensor, with its lse. A row that
  // saw no key (sum 0) gets zeros and lse = -inf; a NaN sum stays NaN.
  auto epilogue = [&](const TileState& t) {
    const TileCoords& c = t.c;
    float total[2], inverse[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      total[r] = quad_sum(softmax.row_sum[r]);
      inverse[r] = total[r] == 0.f ? 0.f : 1.f / total[r];
    }
    // The tile's first row in the (packed) tensor. The sequence's offset is read again rather
    // than kept in a register through the key loop (kept, it spilled at head dims 128, 256).
    const int64_t first_row = int64_t{sequence_span(params.geometry, c.b).q_row0} + c.m_begin;
    const int64_t out_offset = int64_t{c.b} * p.o_batch_stride + int64_t{c.h} * p.o_head_stride +
                               first_row * p.o_row_stride;
    // Accumulator pair (i, i + 1) normalised and rounded to the output type.
    auto output_pair = [&](int i) {
      const float scale = inverse[(i / 2) % 2];
      return pack_pair<Element>(tOrO(i) * scale, tOrO(i + 1) * scale);
    };
    if (stage_o) {
      Tensor sO = sQ(_, _, t.q_buffer);  // (BlockM, HeadDim), swizzled in 16-byte chunks
      // stmatrix: one instruction stores four 8 x 8 blocks of the accumulator layout, a quarter
      // of the stores of 4-byte pairs and without their per-pair swizzled addresses (the trace
      // of 62368ba: 1.6-1.9k cycles from the last P V to the staged O at head dim 128).
      Tensor tOrO_out = make_tensor_like<Element>(tOrO);
      uint32_t* out_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrO_out.data()));
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 2) out_pairs[i / 2] = output_pair(i);
      auto stage_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_o);
      auto thread_stage_copy = stage_copy.get_thread_slice(tid);
      copy(stage_copy, thread_stage_copy.retile_S(tOrO_out), thread_stage_copy.partition_D(sO));
      trace(TraceEvent::kOStaged, t.iteration, 0);
      // Every thread's writes, before the copy engine (the async proxy) reads them.
      cutlass::arch::fence_view_async_shared();
      named_barrier_sync(stage_o_barrier, 128);
      trace(TraceEvent::kOStageSynced, t.iteration, 0);
      if (stores_o) {
        using Rows = typename Traits::OStageRows;
        Tensor mO = params.tma_o.get_tma_tensor(params.shape_o);
        // Rows past seqlen_q fall outside the descriptor's extent: the copy engine skips them.
        // Never varlen here, so the tensors' batch coordinate is c.b. A warpgroup whose rows lie
        // before row 0 (a shifted first tile) stores nothing, but commits its empty group.
        const int32_t own_first_row = c.m_begin + warpgroup_first_row;
        if (own_first_row >= 0) {
          Tensor gO = local_tile(mO(_, _, c.h, c.b), Shape<Rows, typename Traits::HeadDim>{},
                                 make_coord(own_first_row / Rows{}, _0{}));
          Tensor sOwn =
              local_tile(sO, Shape<Rows, typename Traits::HeadDim>{}, make_coord(warpgroup, _0{}));
          auto o_copy = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOwn),
                                      group_modes<0, 2>(gO));
          copy(params.tma_o, get<1>(o_copy), get<0>(o_copy));
        }
        tma_store_arrive();
      } else {
        shared.barrier_q_empty[t.q_buffer].arrive();
      }
      stored_q_buffer = t.q_buffer;
      trace(TraceEvent::kOStoreIssued, t.iteration, 0);
    } else {
      // Pair by pair from registers, in the element type or (p.out_is_float) in fp32. One loop
      // with the choice per store: two loops, one per type, spilled 440 bytes at head dim 64
      // (three consumer warpgroups, whose output always leaves this way). A thread's values lie
      // in two rows (row half (i / 2) % 2) at columns a constant away from its first, so each
      // pair goes through one of two row pointers (computing its 64-bit address per pair took
      // ~33 instructions a pair).
      const int64_t out_bytes = p.out_is_float ? sizeof(float) : sizeof(Element);
      char* out = static_cast<char*>(p.out) + out_offset * out_bytes;
      const int first_col = get<1>(tOcO(0));
      char* row_ptr[2];
      bool row_in_tile[2];
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = get<0>(tOcO(2 * r));
        row_in_tile[r] = row < c.rows && c.m_begin + row >= 0;
        row_ptr[r] = out + (row * p.o_row_stride + first_col) * out_bytes;
      }
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 2) {
        if (row_in_tile[(i / 2) % 2]) {
          char* pair = row_ptr[(i / 2) % 2] + (get<1>(tOcO(i)) - first_col) * out_bytes;
          if (p.out_is_float) {
            const float scale = inverse[(i / 2) % 2];
            *reinterpret_cast<float2*>(pair) = make_float2(tOrO(i) * scale, tOrO(i + 1) * scale);
          } else {
            *reinterpret_cast<uint32_t*>(pair) = output_pair(i);
          }
        }
      }
    }
    if (p.lse != nullptr && lane % 4 == 0) {
      constexpr float kLn2 = 0.6931471805599453f;
      float* lse = static_cast<float*>(p.lse) + int64_t{c.b} * p.lse_batch_stride +
                   int64_t{c.h} * p.lse_head_stride + first_row;
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        if (local_row[r] < c.rows && c.m_begin + local_row[r] >= 0) {
          lse[local_row[r]] =
              total[r] == 0.f ? -INFINITY : (softmax.row_max[r] + log2f(total[r])) * kLn2;
        }
      }
    }
    trace(TraceEvent::kEpilogueDone, t.iteration, 0);
  };

  typename Traits::PipelineState v_state = state;  // the stage of the last P V issued

  // Tile t's last P V stage released (when it has own blocks), then its epilogue.
  auto finish_tile = [&](const TileState& t) {
    if (t.own_blocks > 0) {
      pipeline_v.consumer_release(v_state);
      trace(TraceEvent::kLastPVLanded, t.iteration, 0);
    }
    epilogue(t);
  };

  // Tile t from its first S GEMM (issued and waited for by start_tile) to its last P V.
  auto run_tile = [&](const TileState& t) {
    softmax.reset();
    auto& q_empty = shared.barrier_q_empty[t.q_buffer];
    Tensor tSrQ_tile = tSrQ(_, _, _, t.q_buffer);
    const int own_blocks = t.own_blocks;
    if (own_blocks == 0) {  // no visible key: zeros and lse = -inf
      if (!stage_o) q_empty.arrive();
      release_stored_q_buffer();
      clear(tOrO);
      return;
    }
    // The first (last in key order) block: S, softmax, P; no output yet. n_block counts the
    // blocks left, key_block is the one in hand.
    int n_block = own_blocks - 1;
    int key_block = t.key_block;
    pipeline_k.consumer_release(state);
    trace(TraceEvent::kFirstSLanded, t.iteration, n_block);
    // The masks are read before q_empty completes (the producer may then rebuild them).
    bool hidden = hidden_block(key_block);
    if (n_block == 0 && !stage_o) q_empty.arrive();
    float rescale[2];
    // The narrow block's P is 0 past its keys (the P V GEMM still takes the whole block).
    if (t.narrow) {
      softmax_block(tSrS_narrow, key_block, hidden, rescale);
      convert_p(tSrS_narrow);
    } else {
      softmax_block(tSrS, key_block, hidden, rescale);
      convert_p(tSrS);
    }
    trace(TraceEvent::kFirstSoftmaxDone, t.iteration, n_block);
    release_stored_q_buffer();
    trace(TraceEvent::kStoreReleased, t.iteration, n_block);
    // Each further block, in this warpgroup's turn: issue S_j = Q K_j^T, then
    // O (+)= P_{j-1} V_{j-1} (the first one overwrites O); the softmax of S_j runs while the
    // tensor cores still work on the second GEMM.
    for (--n_block; n_block >= 0; --n_block) {
      typename Traits::PipelineState following = state;
      ++following;
      key_block = next_key_block(t, key_block);
      turn.wait();
      trace(TraceEvent::kTurnTaken, t.iteration, n_block);
      pipeline_k.consumer_wait(following);
      warpgroup_gemm</*kAInRegisters=*/false, /*kWait=*/false>(
          mma_s, tSrQ_tile, tSrK(_, _, _, following.index()), tSrS, /*zero_init=*/true);
      pipeline_v.consumer_wait(state);
      warpgroup_gemm</*kAInRegisters=*/true, /*kWait=*/false>(
          mma_o, tOrP, tOrVt(_, _, _, state.index()), tOrO,
          /*zero_init=*/n_block == own_blocks - 2);
      turn.pass();
      trace(TraceEvent::kGemmsIssued, t.iteration, n_block);
      warpgroup_wait<1>();  // S_j has landed (wgmma groups complete in order)
      finish_operands(tSrS);
      trace(TraceEvent::kSLanded, t.iteration, n_block);
      pipeline_k.consumer_release(following);
      hidden = hidden_block(key_block);
      if (n_block == 0 && !stage_o) q_empty.arrive();  // the tile's last use of Q
      softmax_block(tSrS, key_block, hidden, rescale);
      trace(TraceEvent::kSoftmaxDone, t.iteration, n_block);
      warpgroup_wait<0>();  // O (+)= P_{j-1} V_{j-1} has landed
      finish_operands(tOrO, tOrP);
      trace(TraceEvent::kPVLanded, t.iteration, n_block);
      pipeline_v.consumer_release(state);
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= rescale[(i / 2) % 2];
      convert_p(tSrS);
      trace(TraceEvent::kIterationDone, t.iteration, n_block);
      state = following;
    }
    pipeline_v.consumer_wait(state);
    // Waited for here: a wait in finish_tile made ptxas serialise every wgmma of the kernel.
    warpgroup_gemm</*kAInRegisters=*/true, /*kWait=*/true>(
        mma_o, tOrP, tOrVt(_, _, _, state.index()), tOrO, /*zero_init=*/own_blocks == 1);
    v_state = state;
    ++state;
  };

  // ptxas serialised every wgmma of the kernel (warning C7515) when a group issued by one inlined
  // copy of its issuing code was waited for behind another (two call sites), and when a GEMM was
  // waited for in another function than the one that issued it: one call site each for
  // open_tile, start_tile and run_tile, each GEMM waited for where it is issued.
  for (int iteration = 0;; ++iteration) {
    if (!open_tile(iteration, cur)) break;
    start_tile(cur);
    run_tile(cur);
    finish_tile(cur);
  }
  // The copy engine must have read the last staged tile before the block's shared memory goes.
  if (stored_q_buffer >= 0 && stores_o) tma_store_wait<0>();
}

}  // namespace samattn::hopper
