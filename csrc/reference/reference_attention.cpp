// The fp64 CPU reference: the oracle every test compares against. Straightforward on purpose:
// two passes over the visible keys of each query row, everything in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "attention/validate.h"
#include "common/host_float.h"
#include "reference/reference_mask.h"
#include "reference/reference_pages.h"
#include "reference/reference_workers.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

// max() that lets a NaN through, so a NaN score poisons its row as it does on the GPU.
double nan_propagating_max(double a, double b) { return (std::isnan(b) || b > a) ? b : a; }

// One (batch, head) slice: every query row of it.
void reference_head(const AttentionParams& p, int64_t b, int64_t h, double scale,
                    std::vector<double>& scores) {
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const detail::SequenceRows rows = detail::sequence_rows(p, b);
  const detail::MaskPolicy policy = detail::for_sequence(detail::make_mask_policy(p.causal, p.mask),
                                                         rows.seqlen_q, rows.seqlen_k);
  // Varlen tensors have batch stride 0: the sequence's first row locates it.
  const int64_t q_base =
      b * p.q_strides.batch + h * p.q_strides.head + rows.q_row0 * p.q_strides.seq;
  const int64_t k_base =
      b * p.k_strides.batch + hk * p.k_strides.head + rows.k_row0 * p.k_strides.seq;
  const int64_t v_base =
      b * p.v_strides.batch + hk * p.v_strides.head + rows.k_row0 * p.v_strides.seq;
  const int64_t o_base =
      b * p.out_strides.batch + h * p.out_strides.head + rows.q_row0 * p.out_strides.seq;
  const bool lse_is_double = p.dtype == DType::kFloat64;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  scores.assign(rows.seqlen_k, neg_inf);
  std::vector<char> visible(rows.seqlen_k);
  std::vector<double> accum(p.head_dim_v);
  const int64_t qk_dim = p.head_dim, v_dim = p.head_dim_v;
  const std::vector<double> q =
      detail::rows_as_double(p.q, p.dtype, q_base, p.q_strides.seq, rows.seqlen_q, qk_dim);
  const std::vector<double> k =
      detail::rows_as_double(p.k, p.dtype, k_base, p.k_strides.seq, rows.seqlen_k, qk_dim);
  const std::vector<double> v =
      detail::rows_as_double(p.v, p.dtype, v_base, p.v_strides.seq, rows.seqlen_k, v_dim);

  for (int64_t i = 0; i < rows.seqlen_q; ++i) {
    double row_max = neg_inf;
    for (int64_t j = 0; j < rows.seqlen_k; ++j) {
      double bias = 0.0;
      visible[j] = detail::reference_key_bias(p, policy, b, h, i, j, bias);
      if (!visible[j]) continue;
      double dot = 0.0;
      for (int64_t d = 0; d < qk_dim; ++d) dot += q[i * qk_dim + d] * k[j * qk_dim + d];
      scores[j] = dot * scale + bias;
      row_max = nan_propagating_max(row_max, scores[j]);
    }
    std::fill(accum.begin(), accum.end(), 0.0);
    double row_sum = 0.0;
    const bool any_visible = row_max != neg_inf;
    if (any_visible) {
      for (int64_t j = 0; j < rows.seqlen_k; ++j) {
        if (!visible[j]) continue;
        const double weight = std::exp(scores[j] - row_max);
        row_sum += weight;
        for (int64_t d = 0; d < v_dim; ++d) accum[d] += weight * v[j * v_dim + d];
      }
    }
    for (int64_t d = 0; d < p.head_dim_v; ++d) {
      const double value = any_visible ? accum[d] / row_sum : 0.0;
      detail::store_from_double(p.out, o_base + i * p.out_strides.seq + d, p.dtype, value);
    }
    if (p.lse != nullptr) {
      const double lse = any_visible ? row_max + std::log(row_sum) : neg_inf;
      const int64_t offset = detail::lse_offset(p, b, h, i);
      if (lse_is_double) {
        static_cast<double*>(p.lse)[offset] = lse;
      } else {
        static_cast<float*>(p.lse)[offset] = static_cast<float>(lse);
      }
    }
  }
}

}  // namespace

void reference_attention_forward(const AttentionParams& params) {
  detail::validate_forward_params(params);
  detail::validate_host_cu_seqlens(params);
  detail::validate_host_cache_seqlens(params);
  if (detail::output_rows(params) == 0) return;
  if (params.mask.is_paged()) {
    std::vector<unsigned char> k, v;
    reference_attention_forward(detail::gather_pages(params, k, v));
    return;
  }
  const double scale = detail::resolved_softmax_scale(params);
  const int64_t slices = params.batch * params.heads_q;
  const int64_t workers = detail::reference_workers(
      slices, slices * params.seqlen_q * params.seqlen_k * (params.head_dim + params.head_dim_v));

  auto run_slices = [&](int64_t first) {
    std::vector<double> scores;
    for (int64_t s = first; s < slices; s += workers) {
      reference_head(params, s / params.heads_q, s % params.heads_q, scale, scores);
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(run_slices, w);
  run_slices(0);
  for (auto& thread : threads) thread.join();
}

}  // namespace samattn
