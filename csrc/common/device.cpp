#include "common/device.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::detail {

const DeviceInfo& current_device_info() {
  static std::mutex mutex;
  static std::vector<DeviceInfo> cache;  // by device index; index -1 marks "not queried yet"
  int device = 0;
  SAMATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(cache.size()) <= device)
    cache.resize(device + 1, DeviceInfo{-1, 0, 0, 0, 0});
  DeviceInfo& info = cache[device];
  if (info.index < 0) {
    SAMATTN_CUDA_CHECK(
        cudaDeviceGetAttribute(&info.major, cudaDevAttrComputeCapabilityMajor, device));
    SAMATTN_CUDA_CHECK(
        cudaDeviceGetAttribute(&info.minor, cudaDevAttrComputeCapabilityMinor, device));
    SAMATTN_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_smem_optin,
                                              cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    SAMATTN_CUDA_CHECK(
        cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, device));
    info.index = device;
  }
  return info;
}

unsigned grid_stride_blocks(int64_t units, int threads) {
  const int64_t cap = int64_t{kGridStrideBlocksPerSm} * current_device_info().multiprocessors;
  const int64_t wanted = (units + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap)));
}

void allow_dynamic_smem(const void* kernel, int bytes) {
  constexpr int kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  const DeviceInfo& info = current_device_info();
  SAMATTN_CHECK(bytes <= info.max_smem_optin, "kernel needs ", bytes,
                " bytes of shared memory but device ", info.index, " allows ", info.max_smem_optin);
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, info.index})) return;
  SAMATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({kernel, info.index});
}

}  // namespace samattn::detail
