// The one place AttentionParams turn into what the kernels receive.
#include <cmath>
#include <limits>

#include "attention/kernel_params.h"
#include "attention/validate.h"
#include "common/check.h"

namespace samattn::detail {

ForwardKernelParams make_forward_kernel_params(const AttentionParams& p) {
  ForwardKernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.lse = p.lse;
  k.q_batch_stride = p.q_strides.batch;
  k.q_head_stride = p.q_strides.head;
  k.q_row_stride = p.q_strides.seq;
  k.k_batch_stride = p.k_strides.batch;
  k.k_head_stride = p.k_strides.head;
  k.k_row_stride = p.k_strides.seq * p.kv_stride;
  k.v_batch_stride = p.v_strides.batch;
  k.v_head_stride = p.v_strides.head;
  k.v_row_stride = p.v_strides.seq * p.kv_stride;
  k.o_batch_stride = p.out_strides.batch;
  k.o_head_stride = p.out_strides.head;
  k.o_row_stride = p.out_strides.seq;
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.group_size = p.heads_q / p.heads_kv;
  k.seqlen_q = p.seqlen_q;
  k.kept_keys = strided_key_count(p);
  k.kv_stride = p.kv_stride;
  k.head_dim = static_cast<int>(p.head_dim);
  k.head_dim_v = static_cast<int>(p.head_dim_v);
  k.scale_log2 = resolved_softmax_scale(p) * M_LOG2E;
  k.causal = p.causal;
  k.lse_batch_stride = p.heads_q * p.seqlen_q;
  k.lse_head_stride = p.seqlen_q;
  // Under varlen the kernels set bottom-right causal's shift per sequence (for_sequence).
  k.policy = for_sequence(make_mask_policy(p.causal, p.mask), p.seqlen_q, p.seqlen_k);
  k.has_policy =
      p.mask.has_window() || p.mask.causal_lower_right || p.mask.pattern != SparsePattern::kNone;
  k.mask = p.mask.data;
  k.mask_dtype = p.mask.dtype;
  k.mask_batch_stride = p.mask.batch_stride;
  k.mask_head_stride = p.mask.head_stride;
  k.mask_row_stride = p.mask.row_stride;
  k.mask_col_stride = p.mask.col_stride;
  k.block_map = p.mask.block_map;
  k.block_q = p.mask.block_q;
  k.block_k = p.mask.block_k;
  k.block_batch_stride = p.mask.block_batch_stride;
  k.block_head_stride = p.mask.block_head_stride;
  k.block_row_stride = p.mask.block_row_stride;
  k.block_col_stride = p.mask.block_col_stride;
  k.masked = k.has_policy || k.mask != nullptr || k.block_map != nullptr;
  k.lse_row_stride = 1;
  if (p.mask.is_varlen()) {
    // One launch over (sequence, head, query block); only the tensor-core masked kernel reads
    // these (forward.cpp runs SIMT varlen one sequence at a time).
    k.cu_seqlens_q = p.mask.cu_seqlens_q;
    k.cu_seqlens_k = p.mask.cu_seqlens_k;
    k.total_q = p.mask.total_q;
    k.total_k = p.mask.total_k;
    k.lse_batch_stride = 0;
    k.lse_head_stride = p.mask.total_q;  // lse is (Hq, total_q)
  }
  return k;
}

unsigned query_block_grid(const ForwardKernelParams& params, int block_m) {
  const int64_t m_blocks = (params.seqlen_q + block_m - 1) / block_m;
  const int64_t blocks = m_blocks * params.batch * params.heads_q;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * ceil(seqlen_q / ",
                block_m, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  return static_cast<unsigned>(blocks);
}

}  // namespace samattn::detail
