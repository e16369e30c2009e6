#include "common/stream_counter.h"

#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_check.h"

namespace samattn::detail {

int32_t* stream_work_counter(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    // The legacy stream cannot be queried while another stream captures: no counter, and the
    // failed query must not surface as the next launch's error.
    static_cast<void>(cudaGetLastError());
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;

  int device = 0;
  SAMATTN_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int32_t*> counters;
  const std::lock_guard<std::mutex> lock(mutex);
  int32_t*& counter = counters[{device, stream}];
  if (counter == nullptr) {
    void* memory = nullptr;
    SAMATTN_CUDA_CHECK(cudaMalloc(&memory, sizeof(int32_t)));
    SAMATTN_CUDA_CHECK(cudaMemsetAsync(memory, 0, sizeof(int32_t), stream));
    counter = static_cast<int32_t*>(memory);
  }
  return counter;
}

}  // namespace samattn::detail
