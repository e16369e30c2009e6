// Internal: the producer of the Hopper forward: one thread of warpgroup 0 walks the block's
// query tiles in the scheduler's order, tells the consumers which tile each Q buffer holds
// (publish_tile) and issues every TMA copy: per tile its Q (into a free Q buffer: with two,
// while the consumers still work on the previous tile) and the K and V tiles of its key
// blocks, last to first, into a kStages-deep ring guarded by mbarrier pipelines (full: the copy
// engine has landed the bytes; empty: every consumer thread is done with the stage). The ring
// runs across tiles, so the next tile's first keys and its Q arrive while the consumers finish
// the current one.
#pragma once

#include "attention/hopper/forward_key_blocks.cuh"
#include "attention/hopper/forward_traits.cuh"

namespace samattn::hopper {

template <typename Element, int kHeadDim, int kVariant>
__device__ __forceinline__ void producer_loop(
    const HopperForwardParams<Element, kHeadDim, kVariant>& params,
    typename KernelTraits<Element, kHeadDim, kVariant>::SharedStorage& shared,
    typename KernelTraits<Element, kHeadDim, kVariant>::Pipeline& pipeline_k,
    typename KernelTraits<Element, kHeadDim, kVariant>::Pipeline& pipeline_v) {
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim, kVariant>;
  using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
  const TileSchedule& schedule = params.schedule;
  Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);
  Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);
  Tensor mV = params.tma_v.get_tma_tensor(params.shape_v);
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutKV{});

  auto state = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  int tile_iteration = 0;  // counts the tiles published to the consumers
  int list_requests = 0;   // block-sparse: counts the masks asked of the list warp
  // Block-sparse: each tile's copies walk the key blocks the map lists (forward_key_blocks.cuh).
  const bool sparse = params.p.block_map != nullptr;
  TraceWriter trace(params, /*lane=*/0, /*writes=*/true);
  // Tile i uses Q buffer i % kQBuffers, in the buffer's (i / kQBuffers)-th phase; the buffer
  // must be empty of tile i - kQBuffers before its Q and its published tile are replaced.
  auto acquire_q_buffer = [&](int iteration) {
    const int q_use = iteration / Traits::kQBuffers;
    if (q_use > 0) shared.barrier_q_empty[iteration % Traits::kQBuffers].wait((q_use - 1) & 1);
    return iteration % Traits::kQBuffers;
  };

  // The cursor: tile `half` of the unit taken from the scheduler thread (scheduler_loop), which
  // fetches the next unit, an atomic of ~1k cycles, once this thread releases the slot.
  int taken = 0;
  int32_t unit = 0;
  int tiles = 0, half = 0;
  bool unit_released = true;
  auto take_unit = [&]() {
    shared.barrier_unit_full.wait(taken & 1);
    ++taken;
    unit = published_tile(shared.scheduled_unit).unit;
    trace(TraceEvent::kUnitTaken, tile_iteration, 0);
    half = 0;
    if (unit >= schedule.units) return false;
    tiles = schedule.tiles_in(unit);
    unit_released = false;
    return true;
  };
  auto release_unit = [&]() {
    if (!unit_released) shared.barrier_unit_empty.arrive();
    unit_released = true;
  };
  // Moves the cursor to the next tile; false at the end of the block's work.
  auto next_tile = [&]() {
    if (++half < tiles) return true;
    release_unit();
    return take_unit();
  };
  // Published by the scheduler thread with the unit, read before the unit is released.
  auto coords_at_cursor = [&]() { return published_value<TileCoords>(shared.unit_coords[half]); };
  // Block-sparse: the list warp builds a tile's masks in its Q buffer, so that buffer is taken
  // first.
  auto ask_for_key_blocks = [&](int iteration) {
    const int q_buffer = acquire_q_buffer(iteration);
    trace(TraceEvent::kListRequested, iteration, 0);
    request_key_blocks(shared, unit, half, q_buffer);
    return q_buffer;
  };
  auto wait_for_key_blocks = [&]() {
    wait_key_blocks(shared, list_requests++);
    trace(TraceEvent::kListReady, tile_iteration, 0);
  };
  // The cursor's tile's Q (its query coordinates in c: q_row0, h, b_tensor, m_block) into Q
  // buffer q_buffer, published as tile `iteration` (its coordinates are published beside it
  // first: read by the consumers with a lean tile start, and by this thread for a tile it looked
  // ahead to).
  auto issue_q = [&](const TileCoords& c, int q_buffer, int iteration) {
    // A varlen sequence starts at any row of the packed tensors: its tiles are offset from it.
    // Shifted tiles (TileGeometry::tile_row_shift) start before row 0: the copy engine fills
    // rows outside the tensor with zeros.
    const int32_t first_row = c.q_row0 - params.geometry.tile_row_shift;
    Tensor gQ = local_tile(domain_offset(make_coord(first_row, _0{}), mQ(_, _, c.h, c.b_tensor)),
                           Shape<typename Traits::BlockM, typename Traits::HeadDim>{},
                           make_coord(c.m_block, _0{}));
    auto q_copy = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                group_modes<0, 2>(gQ));
    publish_tile(shared.q_tile[q_buffer], unit, half);
    shared.barrier_q_full[q_buffer].arrive_and_expect_tx(Traits::kQBytes);
    copy(params.tma_q.with(reinterpret_cast<BarrierType&>(shared.barrier_q_full[q_buffer]), 0),
         get<0>(q_copy), get<1>(q_copy)(_, q_buffer));
    trace(TraceEvent::kQIssued, iteration, q_buffer);
  };

  // The tile lookahead (ForwardKernelOptions::tile_lookahead): a few key blocks before a tile's
  // last, the producer moves the cursor to the next tile, finds its coordinates and issues its
  // Q (block-sparse: asks for its masks too), so that at the tile boundary only the next tile's
  // first K is on its way, issued right after the last V. Needs a second Q buffer: the next
  // tile's Q goes where the tile before the current one was. Only on tiles of at least kStages +
  // 2 blocks, past the stage waits that hold the ring full: earlier, the wait for the Q buffer
  // (freed with the tile's first softmax) and the coordinates (~2k cycles) would hold back the
  // tile's own copies (window 256's three-block tiles: 0.99x with the lookahead after the last K).
  constexpr int kLookaheadBlocks = 2;  // the K of the tile's second-to-last block
  // Compiled only where it gains: head dims with two K/V stages (D = 128: +1.6-2.5% at S = 2k,
  // kv_stride 4 +2-2.7%; stop 38). At head dim 64's three stages it measured 0.986-1.012x, and its
  // code spilled the 32- and 40-register producers (sass-report: 182/228 bytes against 60/60).
  constexpr bool kLookahead = Traits::kQBuffers > 1 && Traits::kStages == 2;
  const bool lookahead = kLookahead && params.options.tile_lookahead;
  // The cursor's tile was looked ahead to (not kNotAhead): its Q is in Q buffer ahead_q_buffer
  // with its coordinates published beside it, or (-1) it has no rows.
  constexpr int kNotAhead = -2;
  int ahead_q_buffer = kNotAhead;
  bool more = take_unit();
  while (more) {
    const bool prepared = ahead_q_buffer != kNotAhead;
    int q_buffer = prepared ? ahead_q_buffer : -1;
    ahead_q_buffer = kNotAhead;
    TileCoords c{};  // rows 0: a tile looked ahead to that has none
    if (prepared) {
      if (q_buffer >= 0) c = published_value<TileCoords>(shared.q_tile_coords[q_buffer]);
    } else {
      // Block-sparse: the list warp builds the masks while this thread reads the tile's
      // coordinates (finding them took ~2k cycles here; the scheduler thread finds them now).
      if (sparse && params.options.list_under_coords) q_buffer = ask_for_key_blocks(tile_iteration);
      c = coords_at_cursor();
      if (sparse && !params.options.list_under_coords) {
        q_buffer = ask_for_key_blocks(tile_iteration);
      }
    }
    if (c.rows <= 0) {  // past a varlen sequence's end: nobody works on it
      if (sparse && !prepared) wait_for_key_blocks();
      more = next_tile();
      continue;
    }
    Tensor gK =
        local_tile(domain_offset(make_coord(c.k_row0, _0{}), mK(_, _, c.h_kv, c.b_tensor)),
                   Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, make_coord(_, _0{}));
    Tensor gV =
        local_tile(domain_offset(make_coord(c.k_row0, _0{}), mV(_, _, c.h_kv, c.b_tensor)),
                   Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, make_coord(_, _0{}));
    auto k_copy = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                group_modes<0, 2>(gK));
    auto v_copy = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                group_modes<0, 2>(gV));
    Tensor tKgK = get<0>(k_copy);  // (TMA, key block)
    Tensor tKsK = get<1>(k_copy);  // (TMA, stage)
    Tensor tVgV = get<0>(v_copy);
    Tensor tVsV = get<1>(v_copy);
    // key_block counts from key 0.
    auto load_k = [&](int key_block) {
      pipeline_k.producer_acquire(state);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state), 0), tKgK(_, key_block),
           tKsK(_, state.index()));
      trace(TraceEvent::kKIssued, tile_iteration, key_block - c.n_first);
    };
    auto load_v = [&](int key_block) {
      pipeline_v.producer_acquire(state);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state), 0), tVgV(_, key_block),
           tVsV(_, state.index()));
      ++state;
      trace(TraceEvent::kVIssued, tile_iteration, key_block - c.n_first);
    };
    auto load_own_q = [&]() {
      if (!sparse) q_buffer = acquire_q_buffer(tile_iteration);
      publish_value(shared.q_tile_coords[q_buffer], c);
      issue_q(c, q_buffer, tile_iteration);
    };
    // Block-sparse: the tile's Q needs no list (the consumers wait for the masks on their own
    // barrier), so it goes out while the list warp builds them: after the list, it landed
    // ~1.8k cycles after the consumers had finished the tile before (the trace of stop 36).
    const bool q_before_list = sparse && params.options.q_before_list;
    if (!prepared && q_before_list) load_own_q();
    if (sparse) wait_for_key_blocks();
    // The tile's key blocks, from the last: all of [n_first, n_first + n_blocks), or the
    // listed ones.
    int blocks = c.n_blocks, key_block = c.n_first + c.n_blocks;
    if (sparse) blocks = count_listed(shared.key_blocks[q_buffer].tile, c.n_first, key_block);
    auto next_key_block = [&]() {
      key_block =
          sparse ? listed_below(shared.key_blocks[q_buffer].tile, key_block) : key_block - 1;
    };
    if (!prepared && Traits::kTile.early_q && !q_before_list) load_own_q();
    // The lookahead comes after the K of the tile's second-to-last block, on tiles where that
    // block is past the first kStages (whose copies go out as soon as the tile starts).
    const bool ahead_here = lookahead && blocks >= Traits::kStages + kLookaheadBlocks;
    // The unit's last tile frees the scheduler's slot a block before the producer needs the
    // next unit (at the lookahead, else after the last K), counted in blocks still to issue.
    const bool last_tile = half + 1 == tiles;
    const int release_left = ahead_here ? kLookaheadBlocks + 1 : 1;
    // Without early_q the first K goes out before the wait for Q's buffer: with one Q buffer,
    // the K stage frees up earlier.
    if (blocks > 0) {
      next_key_block();
      load_k(key_block);
      if (last_tile && blocks == release_left) release_unit();
    }
    if (!prepared && !Traits::kTile.early_q && !q_before_list) load_own_q();
    if (blocks > 0) load_v(key_block);
    // left: the blocks still to issue, this one included.
    for (int left = blocks - 1; left > 0; --left) {
      next_key_block();
      load_k(key_block);
      if (last_tile && left == release_left) release_unit();
      if (ahead_here && left == kLookaheadBlocks) {
        more = next_tile();
        if (more) {
          // Read a member at a time: the whole coordinates, held through the rest of the tile's
          // copies, spilled the producer's registers.
          const TileCoordsSlot& next = shared.unit_coords[half];
          auto member = [&](int offset) { return published_word(next, offset); };
          ahead_q_buffer = -1;
          if (member(offsetof(TileCoords, rows)) > 0) {
            ahead_q_buffer = sparse ? ask_for_key_blocks(tile_iteration + 1)
                                    : acquire_q_buffer(tile_iteration + 1);
            copy_published(shared.q_tile_coords[ahead_q_buffer], next);
            TileCoords q{};
            q.q_row0 = member(offsetof(TileCoords, q_row0));
            q.h = member(offsetof(TileCoords, h));
            q.b_tensor = member(offsetof(TileCoords, b_tensor));
            q.m_block = member(offsetof(TileCoords, m_block));
            issue_q(q, ahead_q_buffer, tile_iteration + 1);
          }
        }
      }
      load_v(key_block);
    }
    ++tile_iteration;
    if (!ahead_here) more = next_tile();
  }
  // The end, in the next Q buffer's turn: no bytes to wait for, only this arrival.
  const int q_buffer = acquire_q_buffer(tile_iteration);
  publish_tile(shared.q_tile[q_buffer], kNoMoreTiles.unit, kNoMoreTiles.half);
  shared.barrier_q_full[q_buffer].arrive();
  if (sparse) request_key_blocks(shared, 0, 0, /*q_buffer=*/-1);
}

// One thread of warpgroup 0 (not the TMA thread: fetching from the work counter there took
// registers it did not have) walks the block's units, one at a time: it publishes a unit with its
// tiles' coordinates and takes the next one when the producer releases the published one
// (release_unit).
template <int kBlockM, int kBlockN, typename SharedStorage>
__device__ __forceinline__ void scheduler_loop(const TileSchedule& schedule,
                                               const TileGeometry& geometry,
                                               SharedStorage& shared) {
  int32_t unit = blockIdx.x;
  for (int published = 0;; ++published) {
    if (unit < schedule.units) {
      for (int half = 0; half < schedule.tiles_in(unit); ++half) {
        publish_value(shared.unit_coords[half],
                      tile_coords<kBlockM, kBlockN>(geometry, schedule.tile(unit, half)));
      }
    }
    publish_tile(shared.scheduled_unit, unit, 0);
    shared.barrier_unit_full.arrive();
    if (unit >= schedule.units) return;
    shared.barrier_unit_empty.wait(published & 1);
    unit = next_unit(schedule, unit);
  }
}

}  // namespace samattn::hopper
