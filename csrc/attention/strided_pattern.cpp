#include "attention/strided_pattern.h"

#include <algorithm>

#include "attention/kernel_params.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"

namespace samattn::detail {
namespace {

constexpr size_t kWorkspaceAlignment = 256;

size_t round_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// The residue part's fp32 output and lse, carved from the workspace.
struct PriorPart {
  float* out;  // (batch, heads_q, seqlen_q, head_dim_v)
  float* lse;  // (batch, heads_q, seqlen_q)
};

size_t prior_out_bytes(const AttentionParams& p) {
  return round_up(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * p.head_dim_v) *
                  sizeof(float));
}

size_t prior_lse_bytes(const AttentionParams& p) {
  return round_up(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q) * sizeof(float));
}

PriorPart carve(const AttentionParams& p) {
  auto* base = static_cast<unsigned char*>(p.workspace);
  return {reinterpret_cast<float*>(base), reinterpret_cast<float*>(base + prior_out_bytes(p))};
}

const void* advance(const void* base, int64_t elements, int element_bytes) {
  return static_cast<const char*>(base) + elements * element_bytes;
}

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

// (b, h) pairs of q, k, v merge into one head index with one stride.
bool heads_merge(const AttentionParams& p) {
  return p.batch == 1 || (p.q_strides.batch == p.heads_q * p.q_strides.head &&
                          p.k_strides.batch == p.heads_kv * p.k_strides.head &&
                          p.v_strides.batch == p.heads_kv * p.v_strides.head);
}

// Runs the residue part of batch entries [b0, b0 + batches) (all of them when the heads merge).
void residue_calls(const AttentionParams& p, const PriorPart& prior, int64_t b0, int64_t batches,
                   cudaStream_t stream) {
  const int64_t l = p.mask.pattern_block;
  const int bytes = dtype_size(p.dtype);
  const int64_t dim_v = p.head_dim_v;
  const int64_t heads_q = p.heads_q * batches, heads_kv = p.heads_kv * batches;
  for (const ResidueGroup& g : residue_groups(p.seqlen_q, p.seqlen_k, l, p.mask.window_left)) {
    AttentionParams view = p;
    view.batch = g.count;  // the residue is the batch index
    view.heads_q = heads_q;
    view.heads_kv = heads_kv;
    view.seqlen_q = g.rows;
    view.seqlen_k = g.keys;
    view.kv_stride = 1;
    view.causal = true;
    view.softmax_scale = resolved_softmax_scale(p);
    view.mask = MaskOptions{};
    view.mask.window_left = residue_window(p.mask.window_left, l);
    const int64_t r = g.first_residue;
    view.q = advance(p.q, b0 * p.q_strides.batch + (r + l) * p.q_strides.seq, bytes);
    view.k = advance(p.k, b0 * p.k_strides.batch + r * p.k_strides.seq, bytes);
    view.v = advance(p.v, b0 * p.v_strides.batch + r * p.v_strides.seq, bytes);
    view.q_strides = {p.q_strides.seq, p.q_strides.head, l * p.q_strides.seq};
    view.k_strides = {p.k_strides.seq, p.k_strides.head, l * p.k_strides.seq};
    view.v_strides = {p.v_strides.seq, p.v_strides.head, l * p.v_strides.seq};
    // Output and lse into the workspace rows r + l * (a + 1) of (b, h), in fp32 elements.
    const int64_t first_row = b0 * p.heads_q * p.seqlen_q + r + l;
    view.out = prior.out + first_row * dim_v;
    view.out_strides = {dim_v, p.seqlen_q * dim_v, l * dim_v};
    view.lse = prior.lse + first_row;
    ForwardKernelParams kernel = make_forward_kernel_params(view);
    kernel.out_is_float = true;
    kernel.lse_batch_stride = 1;
    kernel.lse_head_stride = p.seqlen_q;
    kernel.lse_row_stride = l;
    tensor_core::dispatch_forward(p.dtype, kernel, stream);
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
  return prior_out_bytes(p) + prior_lse_bytes(p);
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
  AttentionParams band = p;
  band.mask.pattern = SparsePattern::kNone;
  band.mask.pattern_block = 0;
  band.causal = true;
  band.mask.window_left = p.mask.window_left >= 0 ? std::min(p.mask.window_left, l - 1) : l - 1;
  band.mask.window_right = -1;  // causal already bounds the right side
  ForwardKernelParams kernel = make_forward_kernel_params(band);
  kernel.prior_out = prior.out;  // null without a residue part
  kernel.prior_lse = prior.lse;
  kernel.prior_rows_begin = l;
  tensor_core::dispatch_forward(p.dtype, kernel, stream);
}

}  // namespace samattn::detail
