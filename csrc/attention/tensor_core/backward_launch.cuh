// Internal: the body of the tensor-core launch_backward, included only by the generated
// instantiation files.
#pragma once

#include <algorithm>
#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/backward_kernel.cuh"
#include "attention/tensor_core/backward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"

namespace samattn::tensor_core {

// Opts a kernel into `bytes` of dynamic shared memory; the masked kernels ask once per device
// for the size with the mask tile where the device has it (backward_supports() sends calls that
// need the tile only there).
inline void allow_backward_smem(const void* kernel, int bytes, int with_tile) {
  detail::allow_dynamic_smem(
      kernel, with_tile <= detail::current_device_info().max_smem_optin ? with_tile : bytes);
}

// Blocks of a grid-stride conversion kernel over `elements`.
inline unsigned convert_grid(int64_t elements) {
  return detail::grid_stride_blocks(elements, kConvertThreads);
}

// Shared memory of the (masked or plain) dK/dV and dQ kernels for this call, and the size with
// the mask tile that a masked kernel opts into where the device has it.
template <int kHeadDim>
struct LaunchSmem {
  int bytes, with_tile;
  explicit LaunchSmem(const detail::ForwardKernelParams& f) {
    const bool masked = detail::needs_masked_kernel(f);
    bytes = masked ? backward_masked_smem_bytes(kHeadDim, detail::needs_mask_tile(f))
                   : BackwardConfig<kHeadDim>::kSmemBytes;
    with_tile =
        masked ? backward_masked_smem_bytes(kHeadDim, true) : BackwardConfig<kHeadDim>::kSmemBytes;
  }
};

// Rows of the dQ accumulator: the lse's layout (varlen: heads_q x total_q).
inline int64_t dq_rows(const detail::ForwardKernelParams& f) {
  return f.cu_seqlens_q != nullptr ? f.heads_q * f.total_q : f.batch * f.heads_q * f.seqlen_q;
}

template <DType kDType, int kHeadDim>
void launch_backward_dq(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Cfg = BackwardConfig<kHeadDim>;
  const detail::ForwardKernelParams& f = params.fwd;
  if (f.seqlen_q == 0 || params.skip_convert) return;
  if (params.dq_accum != nullptr) {
    backward_dq_convert_kernel<Element>
        <<<convert_grid(dq_rows(f) * kHeadDim), kConvertThreads, 0, stream>>>(params);
    SAMATTN_CHECK_LAUNCH();
  } else {
    const LaunchSmem<kHeadDim> smem(f);
    const auto kernel = detail::needs_masked_kernel(f)
                            ? backward_dq_kernel<Element, kHeadDim, true>
                            : backward_dq_kernel<Element, kHeadDim, false>;
    allow_backward_smem(reinterpret_cast<const void*>(kernel), smem.bytes, smem.with_tile);
    kernel<<<detail::query_block_grid(f, Cfg::kBlockM), Cfg::kThreads, smem.bytes, stream>>>(
        params);
    SAMATTN_CHECK_LAUNCH();
  }
}

template <DType kDType, int kHeadDim>
void launch_backward(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Cfg = BackwardConfig<kHeadDim>;
  const detail::ForwardKernelParams& f = params.fwd;
  const bool atomic_dq = params.dq_accum != nullptr;
  const bool masked = detail::needs_masked_kernel(f);
  const LaunchSmem<kHeadDim> smem(f);
  const int64_t dq_elements = dq_rows(f) * kHeadDim;
  if (atomic_dq && dq_elements > 0 && !params.skip_zero) {
    SAMATTN_CUDA_CHECK(cudaMemsetAsync(params.dq_accum, 0, dq_elements * sizeof(float), stream));
  }
  if (f.kept_keys > 0) {
    const int64_t n_blocks = (f.kept_keys + Cfg::kBlockN - 1) / Cfg::kBlockN;
    const int64_t blocks = n_blocks * f.batch * params.heads_kv;
    SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_kv * ceil(kept keys / ",
                  Cfg::kBlockN, ") = ", blocks, " exceeds the grid limit of ",
                  std::numeric_limits<int>::max(), " blocks");
    const auto kernel = masked
                            ? (atomic_dq ? backward_dkdv_kernel<Element, kHeadDim, true, true>
                                         : backward_dkdv_kernel<Element, kHeadDim, false, true>)
                            : (atomic_dq ? backward_dkdv_kernel<Element, kHeadDim, true, false>
                                         : backward_dkdv_kernel<Element, kHeadDim, false, false>);
    // Beyond 48 KiB a block must opt in; backward_supports() has checked the device's limit.
    allow_backward_smem(reinterpret_cast<const void*>(kernel), smem.bytes, smem.with_tile);
    kernel<<<static_cast<unsigned>(blocks), Cfg::kDkdvThreads, smem.bytes, stream>>>(params);
    SAMATTN_CHECK_LAUNCH();
  }
  if (params.dk_accum != nullptr && !params.skip_convert) {
    const int64_t elements = f.batch * params.heads_kv * params.seqlen_k * kHeadDim;
    if (elements > 0) {
      backward_dkdv_convert_kernel<Element>
          <<<convert_grid(elements), kConvertThreads, 0, stream>>>(params);
      SAMATTN_CHECK_LAUNCH();
    }
  }
  launch_backward_dq<kDType, kHeadDim>(params, stream);
}

}  // namespace samattn::tensor_core
