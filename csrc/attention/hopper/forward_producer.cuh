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
  auto acquire_q_buffer = [&]() {
    const int q_use = tile_iteration / Traits::kQBuffers;
    if (q_use > 0) shared.barrier_q_empty[tile_iteration % Traits::kQBuffers].wait((q_use - 1) & 1);
    return tile_iteration % Traits::kQBuffers;
  };
  for (int taken = 0;; ++taken) {
    // The scheduler thread's next unit (scheduler_loop); this thread frees the slot once the
    // unit's last K is out (release_unit), so that the next unit's fetch, an atomic of ~1k
    // cycles, runs while this thread waits for the stage of the unit's last V: freed after its
    // last V, the next unit came ~1.1k cycles after that V's copy (the tile timeline of stop 29),
    // and the next tile's Q and first K with it.
    shared.barrier_unit_full.wait(taken & 1);
    const int32_t unit = published_tile(shared.scheduled_unit).unit;
    trace(TraceEvent::kUnitTaken, tile_iteration, 0);
    if (unit >= schedule.units) break;
    const int tiles = schedule.tiles_in(unit);
    bool unit_released = false;
    auto release_unit = [&]() {
      if (!unit_released) shared.barrier_unit_empty.arrive();
      unit_released = true;
    };
    for (int half = 0; half < tiles; ++half) {
      // Block-sparse: the list warp builds the tile's masks (in the Q buffer, so that buffer is
      // taken first) while this thread finds the tile's coordinates, which took ~2k cycles.
      int q_buffer = -1;
      auto ask_for_key_blocks = [&]() {
        q_buffer = acquire_q_buffer();
        trace(TraceEvent::kListRequested, tile_iteration, 0);
        request_key_blocks(shared, unit, half, q_buffer);
      };
      if (sparse && params.options.list_under_coords) ask_for_key_blocks();
      const TileCoords c =
          tile_coords<Traits::kBlockM, Traits::kBlockN>(params.geometry, schedule.tile(unit, half));
      if (sparse && !params.options.list_under_coords) ask_for_key_blocks();
      auto wait_for_key_blocks = [&]() {
        wait_key_blocks(shared, list_requests++);
        trace(TraceEvent::kListReady, tile_iteration, 0);
      };
      if (c.rows <= 0) {  // past a varlen sequence's end: nobody works on it
        if (sparse) wait_for_key_blocks();
        continue;
      }
      // A varlen sequence starts at any row of the packed tensors: its tiles are offset from it.
      Tensor gQ = local_tile(domain_offset(make_coord(c.q_row0, _0{}), mQ(_, _, c.h, c.b_tensor)),
                             Shape<typename Traits::BlockM, typename Traits::HeadDim>{},
                             make_coord(c.m_block, _0{}));
      Tensor gK = local_tile(
          domain_offset(make_coord(c.k_row0, _0{}), mK(_, _, c.h_kv, c.b_tensor)),
          Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, make_coord(_, _0{}));
      Tensor gV = local_tile(
          domain_offset(make_coord(c.k_row0, _0{}), mV(_, _, c.h_kv, c.b_tensor)),
          Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, make_coord(_, _0{}));
      auto q_copy = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                  group_modes<0, 2>(gQ));
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
      auto load_q = [&]() {
        if (!sparse) q_buffer = acquire_q_buffer();
        publish_tile(shared.q_tile[q_buffer], unit, half);
        if constexpr (Traits::kTile.lean_tile_start) {
          publish_value(shared.q_tile_coords[q_buffer], c);
        }
        shared.barrier_q_full[q_buffer].arrive_and_expect_tx(Traits::kQBytes);
        copy(params.tma_q.with(reinterpret_cast<BarrierType&>(shared.barrier_q_full[q_buffer]), 0),
             get<0>(q_copy), get<1>(q_copy)(_, q_buffer));
        trace(TraceEvent::kQIssued, tile_iteration, q_buffer);
      };
      // Block-sparse: the tile's Q needs no list (the consumers wait for the masks on their own
      // barrier), so it goes out while the list warp builds them: after the list, it landed
      // ~1.8k cycles after the consumers had finished the tile before (the trace of stop 36).
      const bool q_before_list = sparse && params.options.q_before_list;
      if (q_before_list) load_q();
      if (sparse) wait_for_key_blocks();
      // The tile's key blocks, from the last: all of [n_first, n_first + n_blocks), or the
      // listed ones.
      int blocks = c.n_blocks, key_block = c.n_first + c.n_blocks;
      if (sparse) blocks = count_listed(shared.key_blocks[q_buffer].tile, c.n_first, key_block);
      auto next_key_block = [&]() {
        key_block =
            sparse ? listed_below(shared.key_blocks[q_buffer].tile, key_block) : key_block - 1;
      };
      // Without early_q the first K goes out before the wait for Q's buffer: with one Q buffer,
      // the K stage frees up earlier.
      if (Traits::kTile.early_q && !q_before_list) load_q();
      const bool last_tile = half + 1 == tiles;
      if (blocks > 0) {
        next_key_block();
        load_k(key_block);
        if (last_tile && blocks == 1) release_unit();
      }
      if (!Traits::kTile.early_q && !q_before_list) load_q();
      if (blocks > 0) load_v(key_block);
      for (int left = blocks - 1; left > 0; --left) {
        next_key_block();
        load_k(key_block);
        if (last_tile && left == 1) release_unit();
        load_v(key_block);
      }
      ++tile_iteration;
    }
    release_unit();  // a unit whose last tile has no key block (or no row)
  }
  // The end, in the next Q buffer's turn: no bytes to wait for, only this arrival.
  const int q_buffer = acquire_q_buffer();
  publish_tile(shared.q_tile[q_buffer], kNoMoreTiles.unit, kNoMoreTiles.half);
  shared.barrier_q_full[q_buffer].arrive();
  if (sparse) request_key_blocks(shared, 0, 0, /*q_buffer=*/-1);
}

// One thread of warpgroup 0 (not the TMA thread: fetching from the work counter there took
// registers it did not have) walks the block's units, one at a time: it publishes a unit and
// takes the next one when the producer has issued the published one's last K (next_unit).
template <typename SharedStorage>
__device__ __forceinline__ void scheduler_loop(const TileSchedule& schedule,
                                               SharedStorage& shared) {
  int32_t unit = blockIdx.x;
  for (int published = 0;; ++published) {
    publish_tile(shared.scheduled_unit, unit, 0);
    shared.barrier_unit_full.arrive();
    if (unit >= schedule.units) return;
    shared.barrier_unit_empty.wait(published & 1);
    unit = next_unit(schedule, unit);
  }
}

}  // namespace samattn::hopper
