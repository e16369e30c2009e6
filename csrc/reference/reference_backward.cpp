// The fp64 CPU reference of the backward: the oracle the SIMT backward is tested against.
// Straightforward on purpose: per query row, the probabilities are recomputed in double from q
// and k (the given lse is not used), then dS = P * (dout . v - D) drives dq, dk and dv. D is
// dout . out with `out` as given, the definition the kernels use, so an output rounded to a
// 16-bit type enters the reference and the kernels alike. dK and dV of one key head sum over
// its query heads in order, in double, and are rounded once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "attention/validate.h"
#include "common/host_float.h"
#include "reference/reference_mask.h"
#include "reference/reference_workers.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

// A (B, H, S, D) tensor's element (b, h, s, d) through its strides; varlen tensors (batch
// stride 0) reach sequence b's rows through row0.
int64_t offset(const Strides& s, int64_t b, int64_t h, int64_t row, int64_t col, int64_t row0 = 0) {
  return b * s.batch + h * s.head + (row0 + row) * s.seq + col;
}

// One (batch, key head): dq of the group's query heads, dk and dv of the key head.
void reference_kv_head(const AttentionBackwardParams& bp, int64_t b, int64_t hk, double scale) {
  const AttentionParams& p = bp.forward;
  const DType t = p.dtype;
  const int64_t group = p.heads_q / p.heads_kv;
  const detail::SequenceRows rows = detail::sequence_rows(p, b);
  const detail::MaskPolicy policy = detail::for_sequence(detail::make_mask_policy(p.causal, p.mask),
                                                         rows.seqlen_q, rows.seqlen_k);
  const int64_t q0 = rows.q_row0, k0 = rows.k_row0;
  const int64_t sk = rows.seqlen_k, d = p.head_dim, dv_dim = p.head_dim_v;
  std::vector<double> dk(sk * d, 0.0), dv(sk * dv_dim, 0.0), dq(d);
  std::vector<double> prob(sk), ds(sk);
  std::vector<char> visible(sk);
  const int64_t sq = rows.seqlen_q;
  const std::vector<double> k =
      detail::rows_as_double(p.k, t, offset(p.k_strides, b, hk, 0, 0, k0), p.k_strides.seq, sk, d);
  const std::vector<double> v = detail::rows_as_double(p.v, t, offset(p.v_strides, b, hk, 0, 0, k0),
                                                       p.v_strides.seq, sk, dv_dim);

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const std::vector<double> q =
        detail::rows_as_double(p.q, t, offset(p.q_strides, b, h, 0, 0, q0), p.q_strides.seq, sq, d);
    const std::vector<double> dout = detail::rows_as_double(
        bp.dout, t, offset(bp.dout_strides, b, h, 0, 0, q0), bp.dout_strides.seq, sq, dv_dim);
    const std::vector<double> out = detail::rows_as_double(
        p.out, t, offset(p.out_strides, b, h, 0, 0, q0), p.out_strides.seq, sq, dv_dim);
    for (int64_t i = 0; i < sq; ++i) {
      // Softmax over the visible keys, in double.
      double row_max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < sk; ++j) {
        double bias = 0.0;
        visible[j] = detail::reference_key_bias(p, policy, b, h, i, j, bias);
        if (!visible[j]) continue;
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
        prob[j] = dot * scale + bias;
        row_max = std::max(row_max, prob[j]);
      }
      std::fill(dq.begin(), dq.end(), 0.0);
      if (row_max != -std::numeric_limits<double>::infinity()) {
        double row_sum = 0.0;
        for (int64_t j = 0; j < sk; ++j) {
          if (!visible[j]) continue;
          prob[j] = std::exp(prob[j] - row_max);
          row_sum += prob[j];
        }
        double delta = 0.0;
        for (int64_t c = 0; c < dv_dim; ++c) delta += dout[i * dv_dim + c] * out[i * dv_dim + c];
        for (int64_t j = 0; j < sk; ++j) {
          if (!visible[j]) continue;
          prob[j] /= row_sum;
          double dp = 0.0;
          for (int64_t c = 0; c < dv_dim; ++c) {
            const double g = dout[i * dv_dim + c];
            dp += g * v[j * dv_dim + c];
            dv[j * dv_dim + c] += prob[j] * g;
          }
          ds[j] = prob[j] * (dp - delta);
          for (int64_t c = 0; c < d; ++c) {
            dq[c] += ds[j] * k[j * d + c];
            dk[j * d + c] += ds[j] * q[i * d + c];
          }
        }
      }
      for (int64_t c = 0; c < d; ++c) {
        detail::store_from_double(bp.dq, offset(bp.dq_strides, b, h, i, c, q0), t, scale * dq[c]);
      }
    }
  }
  // A dense entry's rows past its cache_seqlens are no keys of it: zero gradients.
  const int64_t rows_written = p.mask.has_cache_seqlens() ? p.seqlen_k : sk;
  for (int64_t j = 0; j < rows_written; ++j) {
    for (int64_t c = 0; c < d; ++c) {
      detail::store_from_double(bp.dk, offset(bp.dk_strides, b, hk, j, c, k0), t,
                                j < sk ? scale * dk[j * d + c] : 0.0);
    }
    for (int64_t c = 0; c < dv_dim; ++c) {
      detail::store_from_double(bp.dv, offset(bp.dv_strides, b, hk, j, c, k0), t,
                                j < sk ? dv[j * dv_dim + c] : 0.0);
    }
  }
}

}  // namespace

void reference_attention_backward(const AttentionBackwardParams& params) {
  detail::validate_backward_params(params);
  detail::validate_host_cu_seqlens(params.forward);
  detail::validate_host_cache_seqlens(params.forward);
  const AttentionParams& p = params.forward;
  const double scale = detail::resolved_softmax_scale(p);
  const int64_t slices = p.batch * p.heads_kv;
  if (slices == 0) return;
  // Per query row and key: the scores, dP, and the dQ, dK and dV products.
  const int64_t workers = detail::reference_workers(
      slices, p.batch * p.heads_q * p.seqlen_q * p.seqlen_k * (3 * p.head_dim + 2 * p.head_dim_v));
  auto run_slices = [&](int64_t first) {
    for (int64_t s = first; s < slices; s += workers) {
      reference_kv_head(params, s / p.heads_kv, s % p.heads_kv, scale);
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(run_slices, w);
  run_slices(0);
  for (auto& thread : threads) thread.join();
}

}  // namespace samattn
