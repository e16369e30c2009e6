// Internal: the sm80 mma.sync GEMM's arguments (host and device) and launchers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "samattn/gemm.h"

namespace samattn::detail::sm80 {

// One operand as the kernel walks it; mn is m for A and n for B.
struct OperandArgs {
  const void* ptr;
  int64_t mn_stride, k_stride, batch_stride;  // element strides (0 where the extent is 1)
  bool mn_major;  // walked along mn (its mn stride is the unit or smaller one), else along k
  bool async;     // unit fast stride, 16-byte aligned chunks: cp.async, else scalar loads
};

// The operand of `mn` x `k` elements (per batch) at `ptr` with these element strides, as the
// kernel walks it (defined in dispatch.cpp; CPU tests replay its loads from it).
OperandArgs make_operand(const void* ptr, int64_t mn, int64_t k, int64_t mn_stride,
                         int64_t k_stride, int64_t batch, int64_t batch_stride, int elem_bytes);

// The problem as the kernel sees it: C row-major-like (a column-major C runs as
// C^T = B^T A^T), sizes below 2^31.
struct GemmArgs {
  OperandArgs a, b;
  void* c;
  int64_t c_rs, c_cs, c_bs;
  int m, n, k;
  int tiles_m, tiles_n;  // 128 x 128 output tiles
  float alpha, beta;
  bool c_pairs;  // C's column stride is 1 and two-element stores are aligned
};

// Runs `args` with `batch` batches (kFloat32 runs in TF32); one instantiation per dtype.
template <DType kDType>
void launch(const GemmArgs& args, int64_t batch, cudaStream_t stream);

}  // namespace samattn::detail::sm80
