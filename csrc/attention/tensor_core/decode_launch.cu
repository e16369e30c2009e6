// The decoding kernel's instantiations (float16, bfloat16 x head dims 64, 96, 128, 192, 256), its
// launch and its occupancy.
#include <algorithm>
#include <array>
#include <atomic>
#include <iterator>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/alignment.h"
#include "attention/decode.h"
#include "attention/tensor_core/decode_kernel.cuh"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::tensor_core {
namespace {

using KernelPointer = void (*)(detail::DecodeKernelParams);

template <typename Element, int kHeadDim>
KernelPointer instance() {
  return decode_kernel<Element, kHeadDim>;
}

template <typename Element>
KernelPointer instance_for(int64_t head_dim) {
  switch (head_dim) {
    case 64:
      return instance<Element, 64>();
    case 96:
      return instance<Element, 96>();
    case 128:
      return instance<Element, 128>();
    case 192:
      return instance<Element, 192>();
    case 256:
      return instance<Element, 256>();
    default:
      break;
  }
  SAMATTN_CHECK(false, "the decoding kernel takes head dims ",
                detail::comma_list(detail::kDecodeHeadDims), ", got ", head_dim);
  return nullptr;
}

constexpr int kHeadDimCount = static_cast<int>(std::size(detail::kDecodeHeadDims));

// The instantiation for (dtype, head dim), opted in to its shared memory, and its slot in the
// occupancy cache; the caller (decode_kernel_takes) has checked the pair.
struct Instance {
  KernelPointer kernel;
  int smem_bytes;
  int slot;
};

Instance find_instance(DType dtype, int64_t head_dim) {
  const bool half = dtype == DType::kFloat16;
  SAMATTN_CHECK(half || dtype == DType::kBFloat16,
                "the decoding kernel takes float16 and bfloat16, got ", dtype_name(dtype));
  const KernelPointer kernel =
      half ? instance_for<__half>(head_dim) : instance_for<__nv_bfloat16>(head_dim);
  const int smem = detail::decode_smem_bytes(static_cast<int>(head_dim));
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const int dim_slot = static_cast<int>(
      std::find(std::begin(detail::kDecodeHeadDims), std::end(detail::kDecodeHeadDims), head_dim) -
      std::begin(detail::kDecodeHeadDims));
  return {kernel, smem, (half ? 0 : kHeadDimCount) + dim_slot};
}

constexpr int kCachedDevices = 64;
constexpr int kInstances = 2 * kHeadDimCount;
// 0: not yet queried.
std::array<std::atomic<int>, kCachedDevices * kInstances> blocks_per_sm_cache{};

}  // namespace

int decode_blocks_per_sm(DType dtype, int64_t head_dim) {
  const Instance found = find_instance(dtype, head_dim);
  const int device = detail::current_device_info().index;
  std::atomic<int>* cached =
      device < kCachedDevices ? &blocks_per_sm_cache[device * kInstances + found.slot] : nullptr;
  if (cached != nullptr && cached->load() > 0) return cached->load();
  int blocks = 0;
  SAMATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, reinterpret_cast<const void*>(found.kernel), detail::kDecodeThreads,
      found.smem_bytes));
  SAMATTN_CHECK(blocks > 0, "the decoding kernel does not fit an SM of this device");
  if (cached != nullptr) cached->store(blocks);
  return blocks;
}

void dispatch_decode(DType dtype, int64_t head_dim, int64_t batch,
                     const detail::DecodeKernelParams& params, cudaStream_t stream) {
  const Instance found = find_instance(dtype, head_dim);
  const dim3 grid(static_cast<unsigned>(params.parts), static_cast<unsigned>(params.heads_kv),
                  static_cast<unsigned>(batch));
  found.kernel<<<grid, detail::kDecodeThreads, found.smem_bytes, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::tensor_core
