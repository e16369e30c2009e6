#include "attention/fixed_pattern.h"

#include <algorithm>

#include "attention/hopper/forward_launch.h"
#include "attention/kernel_params.h"
#include "attention/prior_part.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"

namespace samattn::detail {
namespace {

Strides contiguous(int64_t heads, int64_t rows, int64_t dim) {
  return {heads * rows * dim, rows * dim, dim};
}

// The workspace: gathered keys and values, then (b)'s fp32 output and lse.
struct SummaryPart {
  void* keys;
  void* values;
  PriorPart prior;
};

size_t keys_bytes(const AttentionParams& p, int64_t dim) {
  return workspace_round_up(
      static_cast<size_t>(p.batch * p.heads_kv * fixed_summary_keys(p) * dim) *
      dtype_size(p.dtype));
}

SummaryPart carve(const AttentionParams& p) {
  auto* base = static_cast<unsigned char*>(p.workspace);
  const size_t k_bytes = keys_bytes(p, p.head_dim), v_bytes = keys_bytes(p, p.head_dim_v);
  return {base, base + k_bytes, carve_prior_part(base + k_bytes + v_bytes, p)};
}

// (b) as a call of the Hopper forward: causal over the gathered keys (the staircase is set on
// its kernel parameters). keys / values: the gathered tensors, or, to ask hopper::supports()
// before they exist, q (whose checks cover the gathered tensors' alignment, which the workspace's
// 256-byte carving and their contiguous head_dim-element rows give). The output is q's layout
// for the same reason: the fp32 output leaves from registers, not by TMA.
AttentionParams summary_params(const AttentionParams& p, const void* keys, const void* values) {
  AttentionParams s = p;
  const int64_t rows = fixed_summary_keys(p);
  s.mask = MaskOptions{};
  s.causal = true;
  s.kv_stride = 1;
  s.seqlen_k = rows;
  s.softmax_scale = resolved_softmax_scale(p);
  s.k = keys;
  s.v = values;
  s.k_strides = contiguous(p.heads_kv, rows, p.head_dim);
  s.v_strides = contiguous(p.heads_kv, rows, p.head_dim_v);
  s.out = const_cast<void*>(p.q);
  s.out_strides = p.q_strides;
  s.workspace = nullptr;
  return s;
}

// (a): the pattern with no summary columns (mask_policy.h skips the key blocks below each row
// block's own pattern blocks).
AttentionParams local_params(const AttentionParams& p) {
  AttentionParams local = p;
  local.mask.pattern_summary = 0;
  local.workspace = nullptr;
  return local;
}

Status unsupported(const std::string& why) {
  return Status::failure("the fixed pattern's decomposition does not apply: " + why);
}

}  // namespace

int64_t fixed_summary_keys(const AttentionParams& p) {
  const int64_t l = p.mask.pattern_block, c = p.mask.pattern_summary;
  const int64_t full_blocks = p.seqlen_k / l;
  const int64_t in_keys =
      full_blocks * c + std::max<int64_t>(0, p.seqlen_k - full_blocks * l - (l - c));
  const int64_t seen = p.seqlen_q > 0 ? (p.seqlen_q - 1) / l * c : 0;
  return std::min(in_keys, seen);
}

Status fixed_decomposition_status(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  if (m.pattern != SparsePattern::kFixed) return unsupported("no fixed pattern");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return unsupported(concat("dtype ", dtype_name(p.dtype), " (it runs float16 and bfloat16)"));
  }
  if (m.has_element_mask() || m.has_block_map() || m.is_varlen() || m.has_window() ||
      p.kv_stride != 1) {
    return unsupported("an attn_mask, block map, varlen, window or kv_stride on top");
  }
  if (p.batch <= 0 || p.heads_q <= 0 || fixed_summary_keys(p) == 0) {
    return unsupported("no summary part (seqlen_q <= block, or no summary column in the keys)");
  }
  const Status hopper = hopper::supports(summary_params(p, p.q, p.q));
  if (!hopper.ok()) return unsupported(hopper.message());
  const Status tensor_core = tensor_core::supports(local_params(p));
  if (!tensor_core.ok()) return unsupported(tensor_core.message());
  return Status::success();
}

size_t fixed_forward_workspace_bytes(const AttentionParams& p) {
  if (!fixed_decomposition_status(p).ok()) return 0;
  return keys_bytes(p, p.head_dim) + keys_bytes(p, p.head_dim_v) + prior_part_bytes(p);
}

void fixed_forward(const AttentionParams& p, cudaStream_t stream) {
  SAMATTN_CHECK(p.workspace != nullptr, "the fixed pattern's decomposition needs a workspace");
  const SummaryPart part = carve(p);
  const int64_t rows = fixed_summary_keys(p);
  SummaryGather gather{};
  gather.src[0] = p.k;
  gather.src[1] = p.v;
  gather.dst[0] = part.keys;
  gather.dst[1] = part.values;
  gather.src_strides[0] = p.k_strides;
  gather.src_strides[1] = p.v_strides;
  gather.dim[0] = p.head_dim;
  gather.dim[1] = p.head_dim_v;
  gather.batch = p.batch;
  gather.heads = p.heads_kv;
  gather.rows = rows;
  gather.l = p.mask.pattern_block;
  gather.c = p.mask.pattern_summary;
  gather.element_bytes = dtype_size(p.dtype);
  gather_summary_rows(gather, stream);

  // (b) the summary part, into the workspace.
  ForwardKernelParams summary =
      make_forward_kernel_params(summary_params(p, part.keys, part.values));
  summary.out = part.prior.out;
  summary.out_is_float = true;
  summary.o_batch_stride = p.heads_q * p.seqlen_q * p.head_dim_v;
  summary.o_head_stride = p.seqlen_q * p.head_dim_v;
  summary.o_row_stride = p.head_dim_v;
  summary.lse = part.prior.lse;
  summary.staircase_rows = p.mask.pattern_block;
  summary.staircase_keys = p.mask.pattern_summary;
  hopper::dispatch_forward(p.dtype, summary, stream);

  // (a) the local part, merging (b) into every row from l on.
  ForwardKernelParams local = make_forward_kernel_params(local_params(p));
  local.prior_out = part.prior.out;
  local.prior_lse = part.prior.lse;
  local.prior_rows_begin = p.mask.pattern_block;
  tensor_core::dispatch_forward(p.dtype, local, stream);
}

}  // namespace samattn::detail
