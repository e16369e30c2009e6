// Internal: the Hopper (sm_90a) forward: host-side support query and dispatch. The kernels exist
// only when the library is built with SAMATTN_HAVE_SM90 (CuTe headers found); otherwise
// supports() says so and kAuto never picks this path.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/hopper/forward_config.h"
#include "attention/kernel_params.h"
#include "samattn/attention.h"
#include "samattn/types.h"

namespace samattn::hopper {

// kVariant: the entry of forward_config.h's tile table for kHeadDim.
template <DType kDType, int kHeadDim, int kVariant>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream);

// Whether the Hopper path can run `params` (already validated) on the current device; otherwise
// the message says why ("backend hopper does not support ..."). Checks the build, dtype, head
// dims, compute capability 9.0, shared memory and the 16-byte alignment TMA needs.
Status supports(const AttentionParams& params);

// The kernel options from SAMATTN_HOPPER_ABLATION: unset or empty for the default, or a
// comma-separated list of "no_pingpong", "no_staged_store", "static_schedule",
// "wide_first_block", "list_after_coords", "q_after_list", "scaled_mask", "no_lookahead",
// "paired_tail", "partial_last_tile" and "varlen_block_per_unit" that switches those features (for
// benchmarks; forward_config.h). Throws samattn::Error naming the variable on anything else.
ForwardKernelOptions forward_options_from_environment();

// The tile variant from SAMATTN_HOPPER_TILE (benchmarks): unset or empty for `fallback` (the
// caller's tile_variant_for_shape), else an index into the head dim's tile table (a head dim
// with a single entry, 256, ignores it). Entries other than tile_in_every_build's exist only in
// builds with -DSAMATTN_HOPPER_TUNING=ON; anything else throws samattn::Error naming the
// variable.
int forward_tile_variant_from_environment(int64_t head_dim, int fallback);

// Picks the instantiation for (dtype, head dim) and launches it. The caller has checked
// supports().
void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params, cudaStream_t stream);

}  // namespace samattn::hopper
