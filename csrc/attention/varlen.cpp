#include "attention/varlen.h"

#include "attention/validate.h"
#include "attention/views.h"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::detail {

std::vector<VarlenSequence> read_varlen_sequences(const AttentionParams& p, cudaStream_t stream) {
  const size_t entries = static_cast<size_t>(p.batch) + 1;
  std::vector<int32_t> cu_q(entries), cu_k(entries);
  SAMATTN_CUDA_CHECK(cudaMemcpyAsync(cu_q.data(), p.mask.cu_seqlens_q, entries * sizeof(int32_t),
                                     cudaMemcpyDefault, stream));
  SAMATTN_CUDA_CHECK(cudaMemcpyAsync(cu_k.data(), p.mask.cu_seqlens_k, entries * sizeof(int32_t),
                                     cudaMemcpyDefault, stream));
  SAMATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  AttentionParams host = p;
  host.mask.cu_seqlens_q = cu_q.data();
  host.mask.cu_seqlens_k = cu_k.data();
  validate_host_cu_seqlens(host);
  std::vector<VarlenSequence> sequences(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    sequences[b] = {cu_q[b], cu_k[b], cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]};
  }
  return sequences;
}

AttentionParams sequence_params(const AttentionParams& p, const VarlenSequence& s) {
  AttentionParams sub = p;
  const int bytes = dtype_size(p.dtype);
  sub.batch = 1;
  sub.seqlen_q = s.seqlen_q;
  sub.seqlen_k = s.seqlen_k;
  sub.q = advance(p.q, s.q_row0 * p.q_strides.seq, bytes);
  sub.out = advance(p.out, s.q_row0 * p.out_strides.seq, bytes);
  sub.k = advance(p.k, s.k_row0 * p.k_strides.seq, bytes);
  sub.v = advance(p.v, s.k_row0 * p.v_strides.seq, bytes);
  sub.lse = advance(p.lse, s.q_row0, lse_entry_bytes(p.dtype));
  sub.mask.cu_seqlens_q = nullptr;
  sub.mask.cu_seqlens_k = nullptr;
  sub.mask.total_q = sub.mask.total_k = 0;
  return sub;
}

AttentionBackwardParams sequence_backward_params(const AttentionBackwardParams& bp,
                                                 const VarlenSequence& s) {
  AttentionBackwardParams sub = bp;
  sub.forward = sequence_params(bp.forward, s);
  const int bytes = dtype_size(bp.forward.dtype);
  sub.dout = advance(bp.dout, s.q_row0 * bp.dout_strides.seq, bytes);
  sub.dq = advance(bp.dq, s.q_row0 * bp.dq_strides.seq, bytes);
  sub.dk = advance(bp.dk, s.k_row0 * bp.dk_strides.seq, bytes);
  sub.dv = advance(bp.dv, s.k_row0 * bp.dv_strides.seq, bytes);
  return sub;
}

}  // namespace samattn::detail
