// Internal: a work counter in device memory per (device, stream), for persistent kernels whose
// blocks take their next work unit with atomicAdd instead of a fixed round robin.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace samattn::detail {

// One int32 in the current device's memory, zero when the last kernel queued on `stream` that
// used it has finished: such a kernel must leave it at zero (the fetch that takes its last value
// resets it). Kernels on one stream run one after the other, so they can share it; kernels on
// different streams get different counters. Allocated and zeroed (in stream order) on the first
// call for a (device, stream) and kept for the life of the process, since kernels queued on the
// stream may still use it at exit.
//
// Counters are keyed by the stream's handle: a stream destroyed while its kernels still run,
// whose handle a new stream gets at once, would share the counter with them (not guarded).
//
// Returns nullptr while `stream` is being captured into a CUDA graph (a graph can be replayed on
// any stream, alongside other work on this one): the caller then uses its static schedule.
int32_t* stream_work_counter(cudaStream_t stream);

}  // namespace samattn::detail
