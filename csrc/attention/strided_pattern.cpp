#include "attention/strided_pattern.h"

#include <algorithm>

#include "attention/backward_kernel_params.h"
#include "attention/kernel_params.h"
#include "attention/prior_part.h"
#include "attention/tensor_core/backward_launch.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "attention/views.h"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::detail {
namespace {

// The residue part's fp32 output and lse, at the start of the workspace.
PriorPart carve(const AttentionParams& p) { return carve_prior_part(p.workspace, p); }

// The views' window: the residue classes keep i - j = l * t <= W, i.e. view rows a - c = t - 1 <=
// W / l - 1; -1 when the call has no window. A negative result for a window (W < l) means no
// residue pair is visible.
int64_t residue_window(int64_t window_left, int64_t l) {
  return window_left < 0 ? -1 : window_left / l - 1;
}

bool has_residue_part(const AttentionParams& p) {
  const int64_t l = p.mask.pattern_block;
  return p.seqlen_q > l && p.seqlen_k > 0 &&
         (p.mask.window_left < 0 || residue_window(p.mask.window_left, l) >= 0);
}

// One residue group's causal views of batch entries [b0, b0 + batches): the residue is the
// batch index (stride one row), the (batch, head) pairs the heads, rows l rows apart.
struct ResidueView {
  AttentionParams params;  // q, k, v and shapes; out and lse are the caller's
  int64_t first_row;       // the views' row (0, 0, 0) in the (batch, heads_q, seqlen_q) rows
  int64_t first_key;       // their key (0, 0, 0) in the (batch, heads_kv, seqlen_k) rows
};

ResidueView residue_view(const AttentionParams& p, const ResidueGroup& g, int64_t b0,
                         int64_t batches) {
  const int64_t l = p.mask.pattern_block;
  const int bytes = dtype_size(p.dtype);
  const int64_t r = g.first_residue;
  AttentionParams view = p;
  view.batch = g.count;
  view.heads_q = p.heads_q * batches;
  view.heads_kv = p.heads_kv * batches;
  view.seqlen_q = g.rows;
  view.seqlen_k = g.keys;
  view.kv_stride = 1;
  view.causal = true;
  view.softmax_scale = resolved_softmax_scale(p);
  view.mask = MaskOptions{};
  view.mask.window_left = residue_window(p.mask.window_left, l);
  view.q = advance(p.q, b0 * p.q_strides.batch + (r + l) * p.q_strides.seq, bytes);
  view.k = advance(p.k, b0 * p.k_strides.batch + r * p.k_strides.seq, bytes);
  view.v = advance(p.v, b0 * p.v_strides.batch + r * p.v_strides.seq, bytes);
  view.q_strides = {p.q_strides.seq, p.q_strides.head, l * p.q_strides.seq};
  view.k_strides = {p.k_strides.seq, p.k_strides.head, l * p.k_strides.seq};
  view.v_strides = {p.v_strides.seq, p.v_strides.head, l * p.v_strides.seq};
  view.workspace = nullptr;
  return {view, b0 * p.heads_q * p.seqlen_q + r + l, b0 * p.heads_kv * p.seqlen_k + r};
}

// The residue views' lse (and D, and dQ-accumulator rows) live at rows r + l (a + 1) of the
// (batch, heads_q, seqlen_q) arrays: batch (residue) stride 1, head stride seqlen_q, row stride l.
void use_strided_stats(ForwardKernelParams& kernel, const AttentionParams& p) {
  kernel.lse_batch_stride = 1;
  kernel.lse_head_stride = p.seqlen_q;
  kernel.lse_row_stride = p.mask.pattern_block;
}

// Runs the residue part of batch entries [b0, b0 + batches) (all of them when the heads merge).
void residue_calls(const AttentionParams& p, const PriorPart& prior, int64_t b0, int64_t batches,
                   cudaStream_t stream) {
  const int64_t l = p.mask.pattern_block;
  const int64_t dim_v = p.head_dim_v;
  for (const ResidueGroup& g : residue_groups(p.seqlen_q, p.seqlen_k, l, p.mask.window_left)) {
    ResidueView rv = residue_view(p, g, b0, batches);
    // Output and lse into the workspace rows r + l * (a + 1) of (b, h), in fp32 elements.
    rv.params.out = prior.out + rv.first_row * dim_v;
    rv.params.out_strides = {dim_v, p.seqlen_q * dim_v, l * dim_v};
    rv.params.lse = prior.lse + rv.first_row;
    ForwardKernelParams kernel = make_forward_kernel_params(rv.params);
    kernel.out_is_float = true;
    use_strided_stats(kernel, p);
    tensor_core::dispatch_forward(p.dtype, kernel, stream);
  }
}

// The band (a): a causal window of min(l - 1, W) keys, the pattern otherwise cleared.
AttentionParams band_params(const AttentionParams& p) {
  const int64_t l = p.mask.pattern_block;
  AttentionParams band = p;
  band.mask.pattern = SparsePattern::kNone;
  band.mask.pattern_block = 0;
  band.causal = true;
  band.mask.window_left = p.mask.window_left >= 0 ? std::min(p.mask.window_left, l - 1) : l - 1;
  band.mask.window_right = -1;  // causal already bounds the right side
  return band;
}

// The dK / dV accumulators: fp32, contiguous (batch, heads_kv, seqlen_k, head_dim).
size_t accumulator_bytes(const AttentionParams& p) {
  return workspace_round_up(static_cast<size_t>(p.batch * p.heads_kv * p.seqlen_k * p.head_dim) *
                            sizeof(float));
}

// Runs the residue part's backward of batch entries [b0, b0 + batches).
void residue_backward_calls(const AttentionBackwardParams& bp, const BackwardKernelParams& full,
                            int64_t b0, int64_t batches, cudaStream_t stream) {
  const AttentionParams& p = bp.forward;
  const int64_t l = p.mask.pattern_block;
  const int bytes = dtype_size(p.dtype);
  const int64_t dim = p.head_dim;
  for (const ResidueGroup& g : residue_groups(p.seqlen_q, p.seqlen_k, l, p.mask.window_left)) {
    ResidueView rv = residue_view(p, g, b0, batches);
    rv.params.lse = static_cast<float*>(p.lse) + rv.first_row;
    BackwardKernelParams kernel = full;
    kernel.fwd = make_forward_kernel_params(rv.params);
    use_strided_stats(kernel.fwd, p);
    kernel.delta = static_cast<float*>(full.delta) + rv.first_row;
    kernel.dq_accum = static_cast<float*>(full.dq_accum) + rv.first_row * dim;
    kernel.dout = advance(
        bp.dout, b0 * bp.dout_strides.batch + (g.first_residue + l) * bp.dout_strides.seq, bytes);
    kernel.do_batch_stride = bp.dout_strides.seq;
    kernel.do_head_stride = bp.dout_strides.head;
    kernel.do_row_stride = l * bp.dout_strides.seq;
    kernel.heads_kv = rv.params.heads_kv;
    kernel.seqlen_k = rv.params.seqlen_k;
    kernel.dk_accum = full.dk_accum + rv.first_key * dim;
    kernel.dv_accum = full.dv_accum + rv.first_key * dim;
    kernel.acc_batch_stride = dim;
    kernel.acc_head_stride = p.seqlen_k * dim;
    kernel.acc_row_stride = l * dim;
    kernel.skip_convert = true;
    tensor_core::dispatch_backward(p.dtype, kernel, stream);
  }
}

}  // namespace

std::vector<ResidueGroup> residue_groups(int64_t seqlen_q, int64_t seqlen_k, int64_t l,
                                         int64_t window_left) {
  std::vector<ResidueGroup> groups;
  if (seqlen_q <= l || seqlen_k <= 0) return groups;
  if (window_left >= 0 && residue_window(window_left, l) < 0) return groups;
  // r < l < seqlen_q: at most seqlen_q iterations of host arithmetic.
  for (int64_t r = 0; r < l; ++r) {
    const int64_t rows = r + l <= seqlen_q - 1 ? (seqlen_q - 1 - r - l) / l + 1 : 0;
    const int64_t all_keys = r <= seqlen_k - 1 ? (seqlen_k - 1 - r) / l + 1 : 0;
    const int64_t keys = std::min(all_keys, rows);  // view row a sees keys c <= a
    if (rows == 0) break;                           // rows only shrink with r
    if (!groups.empty() && groups.back().rows == rows && groups.back().keys == keys) {
      ++groups.back().count;
    } else {
      groups.push_back({r, 1, rows, keys});
    }
  }
  return groups;
}

bool strided_decomposition_applies(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  return m.pattern == SparsePattern::kStrided && m.pattern_block >= 1 &&
         (p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) && !m.has_element_mask() &&
         !m.has_block_map() && !m.is_varlen() && p.kv_stride == 1;
}

size_t strided_forward_workspace_bytes(const AttentionParams& p) {
  if (!strided_decomposition_applies(p) || p.batch <= 0 || !has_residue_part(p)) return 0;
  return prior_part_bytes(p);
}

void strided_forward(const AttentionParams& p, cudaStream_t stream) {
  const int64_t l = p.mask.pattern_block;
  const bool residues = strided_forward_workspace_bytes(p) > 0;
  SAMATTN_CHECK(!residues || p.workspace != nullptr,
                "the strided pattern's decomposition needs a workspace");
  const PriorPart prior = residues ? carve(p) : PriorPart{nullptr, nullptr};
  // (b) the residue classes, into the workspace.
  if (residues && heads_merge(p)) {
    residue_calls(p, prior, 0, p.batch, stream);
  } else if (residues) {
    for (int64_t b = 0; b < p.batch; ++b) residue_calls(p, prior, b, 1, stream);
  }
  // (a) the band, merging (b) into every row from l on.
  ForwardKernelParams kernel = make_forward_kernel_params(band_params(p));
  kernel.prior_out = prior.out;  // null without a residue part
  kernel.prior_lse = prior.lse;
  kernel.prior_rows_begin = l;
  tensor_core::dispatch_forward(p.dtype, kernel, stream);
}

bool strided_backward_applies(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.forward;
  return !bp.deterministic && strided_decomposition_applies(p) && p.batch > 0 &&
         has_residue_part(p) && tensor_core::backward_has_kernel(p);
}

size_t strided_backward_workspace_bytes(const AttentionBackwardParams& bp) {
  return strided_backward_applies(bp) ? 2 * accumulator_bytes(bp.forward) : 0;
}

void strided_backward(const AttentionBackwardParams& bp, const BackwardKernelParams& full,
                      void* accumulators, cudaStream_t stream) {
  const AttentionParams& p = bp.forward;
  BackwardKernelParams base = full;
  base.dk_accum = static_cast<float*>(accumulators);
  base.dv_accum =
      reinterpret_cast<float*>(static_cast<unsigned char*>(accumulators) + accumulator_bytes(p));
  base.skip_zero = true;
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  SAMATTN_CUDA_CHECK(cudaMemsetAsync(base.dq_accum, 0, rows * p.head_dim * sizeof(float), stream));
  SAMATTN_CUDA_CHECK(cudaMemsetAsync(accumulators, 0, 2 * accumulator_bytes(p), stream));
  // (b) the residue classes, adding into the accumulators.
  if (heads_merge(p, &bp.dout_strides)) {
    residue_backward_calls(bp, base, 0, p.batch, stream);
  } else {
    for (int64_t b = 0; b < p.batch; ++b) residue_backward_calls(bp, base, b, 1, stream);
  }
  // (a) the band, then the conversions of dQ, dK and dV for the whole problem.
  BackwardKernelParams band = base;
  band.fwd = make_forward_kernel_params(band_params(p));
  band.acc_batch_stride = p.heads_kv * p.seqlen_k * p.head_dim;
  band.acc_head_stride = p.seqlen_k * p.head_dim;
  band.acc_row_stride = p.head_dim;
  tensor_core::dispatch_backward(p.dtype, band, stream);
}

}  // namespace samattn::detail
