// Internal: turn CUDA failures into samattn::Error with the call site.
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "samattn/error.h"

namespace samattn::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error in ") + what + " at " + file + ":" + std::to_string(line) +
              ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace samattn::detail

#define SAMATTN_CUDA_CHECK(call)                                                \
  do {                                                                          \
    const cudaError_t samattn_status_ = (call);                                 \
    if (samattn_status_ != cudaSuccess) {                                       \
      ::samattn::detail::throw_cuda_error(samattn_status_, #call, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

// After a <<<...>>> launch: reports invalid configurations and earlier asynchronous faults.
#define SAMATTN_CHECK_LAUNCH() SAMATTN_CUDA_CHECK(cudaGetLastError())
