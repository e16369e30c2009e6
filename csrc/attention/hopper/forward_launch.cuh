// Internal: the body of hopper::launch_forward, included only by the generated instantiation
// files (compiled for sm_90a alone): builds the TMA descriptors and the tile schedule (with the
// stream's work counter) and launches the persistent kernel with one block per SM (or per work
// unit, if fewer).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/hopper/forward_kernel.cuh"
#include "attention/hopper/forward_launch.h"
#include "attention/hopper/forward_scheduler.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/stream_counter.h"

#if defined(SAMATTN_HOPPER_TRACE)
#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

namespace samattn::hopper {

template <DType kDType>
struct CuteElementOf;
template <>
struct CuteElementOf<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct CuteElementOf<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};

namespace detail_launch {

// A dimension of extent 1 is never stepped along, so its stride may be anything; TMA still wants
// every stride 16-byte aligned, so such strides become `aligned` (supports() has checked the
// others). An empty sequence (no kept keys) gets extent 1: no tile of it is ever loaded.
inline int64_t usable_stride(int64_t stride, int64_t extent, int64_t aligned) {
  return extent > 1 ? stride : aligned;
}

// Pointee: const Element for what the kernel reads, Element for the output.
template <typename Pointee>
auto gmem_tensor(const void* base, int64_t seqlen, int head_dim, int64_t heads, int64_t batch,
                 int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  using namespace cute;
  const int64_t aligned = head_dim;  // head_dim elements: a multiple of 16 bytes
  const GmemShape shape(static_cast<int32_t>(seqlen > 0 ? seqlen : 1), head_dim,
                        static_cast<int32_t>(heads), static_cast<int32_t>(batch));
  const GmemStride stride(usable_stride(row_stride, seqlen, aligned), _1{},
                          usable_stride(head_stride, heads, aligned),
                          usable_stride(batch_stride, batch, aligned));
  return make_tensor(make_gmem_ptr(static_cast<Pointee*>(const_cast<void*>(base))),
                     make_layout(shape, stride));
}

#if defined(SAMATTN_HOPPER_TRACE)
// The diagnostic build's timeline (forward_trace.cuh), only while SAMATTN_HOPPER_TRACE_FILE is
// set: one buffer, grown as needed and cleared before each call, and written after it to that
// file as a header of int64 (magic, blocks, lanes, capacity, block_m, block_n) and the records.
inline constexpr int kTraceCapacity = 1 << 14;  // records per lane: 128 key blocks x 16 tiles
inline ForwardTrace trace_buffer(unsigned blocks, int lanes, cudaStream_t stream) {
  if (std::getenv("SAMATTN_HOPPER_TRACE_FILE") == nullptr) return ForwardTrace{nullptr, lanes, 0};
  static unsigned long long* records = nullptr;
  static size_t allocated = 0;
  const size_t bytes = size_t{blocks} * lanes * kTraceCapacity * 2 * sizeof(unsigned long long);
  if (bytes > allocated) {
    if (records != nullptr) SAMATTN_CUDA_CHECK(cudaFree(records));
    SAMATTN_CUDA_CHECK(cudaMalloc(&records, bytes));
    allocated = bytes;
  }
  SAMATTN_CUDA_CHECK(cudaMemsetAsync(records, 0, bytes, stream));
  return ForwardTrace{records, lanes, kTraceCapacity};
}

inline void write_trace(const ForwardTrace& trace, unsigned blocks, int block_m, int block_n,
                        cudaStream_t stream) {
  const char* path = std::getenv("SAMATTN_HOPPER_TRACE_FILE");
  if (path == nullptr || trace.records == nullptr) return;
  const size_t words = size_t{blocks} * trace.lanes * trace.capacity * 2;
  std::vector<unsigned long long> host(words);
  SAMATTN_CUDA_CHECK(cudaMemcpyAsync(host.data(), trace.records, words * sizeof(host[0]),
                                     cudaMemcpyDeviceToHost, stream));
  SAMATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t header[] = {kTraceMagic, blocks, trace.lanes, trace.capacity, block_m, block_n};
  std::FILE* file = std::fopen(path, "wb");
  SAMATTN_CHECK(file != nullptr, "SAMATTN_HOPPER_TRACE_FILE: cannot open ", path);
  const bool written = std::fwrite(header, sizeof(header), 1, file) == 1 &&
                       std::fwrite(host.data(), sizeof(host[0]), words, file) == words;
  std::fclose(file);
  SAMATTN_CHECK(written, "SAMATTN_HOPPER_TRACE_FILE: cannot write ", path);
}
#endif

}  // namespace detail_launch

template <DType kDType, int kHeadDim, int kVariant>
void launch_forward(const detail::ForwardKernelParams& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename CuteElementOf<kDType>::type;
  using Traits = KernelTraits<Element, kHeadDim, kVariant>;
  // supports() has checked that the tiles fit the scheduler's int32 unit indices.
  const ForwardKernelOptions options = forward_options_from_environment();
  const int sms = detail::current_device_info().multiprocessors;
  // Two rounds of units at the end as single tiles, heaviest first (forward_scheduler.h;
  // benchmarks/schedule_model.py: two rounds balance the last one better than one at S <= 1k).
  TileSchedule schedule = make_tile_schedule(p.batch * p.heads_q, p.seqlen_q, Traits::kBlockM,
                                             p.causal, options.tail_singles ? int64_t{2} * sms : 0);
  int32_t* counter = options.dynamic_schedule && schedule.units > sms
                         ? detail::stream_work_counter(stream)  // null while a graph is captured
                         : nullptr;
  // Varlen units cost what their sequences' lengths (on the device) make them: without a work
  // counter to balance them, one block per unit lets the hardware do it (unless the static
  // schedule is asked for).
  const bool block_per_unit =
      p.cu_seqlens_q != nullptr &&
      (options.varlen_block_per_unit || (options.dynamic_schedule && counter == nullptr));
  // supports() has bounded the units by 2^30, within the grid's limit.
  const unsigned blocks =
      static_cast<unsigned>(schedule.units < sms || block_per_unit ? schedule.units : sms);
  schedule.counter = block_per_unit ? nullptr : counter;  // one unit per block: nothing to balance
  const int64_t heads_kv = p.heads_q / p.group_size;

  // Varlen tensors are packed: one batch of total_q (total_k) rows; the kernel finds each
  // sequence's rows from cu_seqlens per tile.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t tensor_batch = varlen ? 1 : p.batch;
  const int64_t q_rows = varlen ? p.total_q : p.seqlen_q;
  const int64_t k_rows = varlen ? p.total_k : p.kept_keys;
  auto q =
      detail_launch::gmem_tensor<const Element>(p.q, q_rows, kHeadDim, p.heads_q, tensor_batch,
                                                p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  // With no kept keys the kernel loads no K/V tile, and k/v may be empty allocations (null, or
  // zero strides): their descriptors then describe q instead, which is valid and never read.
  const bool no_keys = k_rows == 0;
  auto k = no_keys ? q
                   : detail_launch::gmem_tensor<const Element>(p.k, k_rows, kHeadDim, heads_kv,
                                                               tensor_batch, p.k_row_stride,
                                                               p.k_head_stride, p.k_batch_stride);
  auto v = no_keys ? q
                   : detail_launch::gmem_tensor<const Element>(p.v, k_rows, kHeadDim, heads_kv,
                                                               tensor_batch, p.v_row_stride,
                                                               p.v_head_stride, p.v_batch_stride);
  // An fp32 output leaves from registers (forward_consumer.cuh): the store descriptor, never
  // used, then describes q.
  auto out =
      p.out_is_float
          ? detail_launch::gmem_tensor<Element>(p.q, q_rows, kHeadDim, p.heads_q, tensor_batch,
                                                p.q_row_stride, p.q_head_stride, p.q_batch_stride)
          : detail_launch::gmem_tensor<Element>(p.out, q_rows, kHeadDim, p.heads_q, tensor_batch,
                                                p.o_row_stride, p.o_head_stride, p.o_batch_stride);
  // Causal's key end per row (TileGeometry::causal_key_step): n * kv_stride <= i, or the
  // staircase of the fixed pattern's summary part.
  const bool staircase = p.staircase_keys > 0;
  const int64_t rows_per_step =
      staircase ? p.staircase_rows : std::min(p.kv_stride, std::max<int64_t>(p.seqlen_q, 1));
  // The short causal tile first (ForwardKernelOptions::partial_first_tile): its rows before row
  // 0 make whole warpgroups without rows, which the consumers skip.
  const bool shift_tiles =
      options.partial_first_tile && p.causal && !p.has_policy && p.block_map == nullptr && !varlen;
  const int64_t rows_past_end = int64_t{schedule.m_blocks} * Traits::kBlockM - p.seqlen_q;
  const int64_t tile_row_shift = shift_tiles ? rows_past_end / 64 * 64 : 0;
  // supports() has bounded every extent by 2^31 - 1.
  const TileGeometry geometry{
      static_cast<int32_t>(p.seqlen_q),
      static_cast<int32_t>(p.kept_keys),
      static_cast<int32_t>(rows_per_step),
      static_cast<int32_t>(staircase ? p.staircase_keys : 1),
      staircase ? 0 : 1,
      static_cast<int32_t>(p.heads_q),
      static_cast<int32_t>(p.group_size),
      p.causal,
      p.has_policy,  // supports() takes a window or bottom-right causal (kv_stride 1), no pattern
      p.policy,
      p.cu_seqlens_q,
      p.cu_seqlens_k,
      static_cast<int32_t>(p.total_q),
      static_cast<int32_t>(p.total_k),
      static_cast<int32_t>(tile_row_shift)};
  HopperForwardParams<Element, kHeadDim, kVariant> params{
      p,
      geometry,
      schedule,
      options,
      q.shape(),
      k.shape(),
      v.shape(),
      out.shape(),
      make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(typename Traits::SmemLayoutQ{}),
                    Shape<typename Traits::BlockM, typename Traits::HeadDim>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Traits::SmemLayoutKV{}),
                    Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename Traits::SmemLayoutKV{}),
                    Shape<typename Traits::BlockN, typename Traits::HeadDim>{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, out, typename Traits::SmemLayoutOStage{},
                    Shape<typename Traits::OStageRows, typename Traits::HeadDim>{}, _1{}),
  };

  const auto kernel = forward_kernel<Element, kHeadDim, kVariant>;
  // Beyond 48 KiB a block must opt in; supports() has checked the device's limit.
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes);
  if (blocks == 0) return;
#if defined(SAMATTN_HOPPER_TRACE)
  params.trace = detail_launch::trace_buffer(blocks, 1 + Traits::kConsumerWarpgroups, stream);
#endif
  kernel<<<blocks, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
#if defined(SAMATTN_HOPPER_TRACE)
  detail_launch::write_trace(params.trace, blocks, Traits::kBlockM, Traits::kBlockN, stream);
#endif
}

}  // namespace samattn::hopper
