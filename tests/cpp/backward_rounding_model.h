// The test rule of the tensor-core backward (fp16/bf16), which feeds P and dS to the tensor cores
// as 16-bit operands (as FlashAttention-2/3 do) and accumulates in fp32.
//
// rounded_backward(): a same-dtype reference. fp64 arithmetic on the problem's inputs, with the
// two roundings the kernels make: P rounded to the dtype before dV = P^T dO, dS = P * (dP - D)
// (from the unrounded P) rounded to the dtype before dQ = scale dS K and dK = scale dS^T Q;
// outputs rounded to the dtype. It also returns, per gradient element, the magnitude of the terms
// the element sums: sum_i |P_ij| |dO_ic| for dV, |scale| sum P (|dP| + |D|) |Q| for dK, |scale| sum
// P (|dP| + |D|) |K| for dQ (dK, dV summed over the query heads of the group).
//
// within_backward_rule(): the bound, two parts, each needed:
//  1. FlashAttention-3's rule: max |got - ref| <= 2 max |rounded - ref| + u max(terms). The
//     kernel's error is the same-dtype reference's up to fp32 arithmetic; 2x is FA3's margin,
//     u * terms (u: unit roundoff) covers a maximum that happens to be small by cancellation.
//  2. Element-wise: |got - ref| <= rtol |ref| + atol scale (the dtype rule of test_support.h, for
//     the output rounding and fp32 accumulation) + 2 u terms. Rounding each P (or dS) to the
//     dtype changes it by at most u relative, so a correct kernel's element is off by at most
//     u * terms from P rounding; the factor 2 is margin for fp32 (exp2, D, dP). A wrong term
//     (mask, fragment map, race) of more than 2u of the terms fails here even where the maximum
//     error of part 1 is dominated by other elements.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "reference/reference_mask.h"
#include "test_support.h"

namespace samattn::testing {

// Unit roundoff of a 16-bit type: 2^-8 (bf16, 8 significant bits), 2^-11 (fp16).
inline double unit_roundoff_16(DType dtype) {
  return dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

struct RoundedBackward {
  HostTensor dq, dk, dv;  // laid out like params.dq / dk / dv (same strides)
  std::vector<double> dq_terms, dk_terms, dv_terms;
};

// Host-memory params (params.forward.q ... params.dv point at host tensors of `like` sizes).
inline RoundedBackward rounded_backward(const AttentionBackwardParams& bp, int64_t dq_size,
                                        int64_t dk_size, int64_t dv_size) {
  const AttentionParams& p = bp.forward;
  const DType t = p.dtype;
  const double scale = p.softmax_scale ? *p.softmax_scale : default_softmax_scale(p.head_dim);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t sk = p.seqlen_k, d = p.head_dim, dvd = p.head_dim_v;
  RoundedBackward r{HostTensor(t, dq_size),
                    HostTensor(t, dk_size),
                    HostTensor(t, dv_size),
                    std::vector<double>(dq_size, 0.0),
                    std::vector<double>(dk_size, 0.0),
                    std::vector<double>(dv_size, 0.0)};
  const auto at = [](const Strides& s, int64_t b, int64_t h, int64_t row) {
    return b * s.batch + h * s.head + row * s.seq;
  };
  std::vector<double> bias(sk);
  std::vector<double> prob(sk), ds(sk), dk(sk * d), dk_terms(sk * d), dv(sk * dvd),
      dv_terms(sk * dvd), dq(d), dq_terms(d);
  for (int64_t b = 0; b < p.batch; ++b) {
    // An entry's own keys (cache_seqlens), which bottom-right causal aligns to; the rows past
    // them get zero gradients.
    const int64_t keys = p.mask.has_cache_seqlens() ? p.mask.cache_seqlens[b] : sk;
    const detail::MaskPolicy policy =
        detail::for_sequence(detail::make_mask_policy(p.causal, p.mask), p.seqlen_q, keys);
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dk_terms.begin(), dk_terms.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      std::fill(dv_terms.begin(), dv_terms.end(), 0.0);
      // The slices' rows as doubles, converted once (host_float.h's rows_as_double).
      const std::vector<double> k_rows =
          detail::rows_as_double(p.k, t, at(p.k_strides, b, hk, 0), p.k_strides.seq, sk, d);
      const std::vector<double> v_rows =
          detail::rows_as_double(p.v, t, at(p.v_strides, b, hk, 0), p.v_strides.seq, sk, dvd);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t sq = p.seqlen_q;
        const std::vector<double> q_rows =
            detail::rows_as_double(p.q, t, at(p.q_strides, b, h, 0), p.q_strides.seq, sq, d);
        const std::vector<double> dout_rows = detail::rows_as_double(
            bp.dout, t, at(bp.dout_strides, b, h, 0), bp.dout_strides.seq, sq, dvd);
        const std::vector<double> out_rows = detail::rows_as_double(
            p.out, t, at(p.out_strides, b, h, 0), p.out_strides.seq, sq, dvd);
        for (int64_t i = 0; i < sq; ++i) {
          // Which keys the row sees and the additive mask term of each (reference_mask.h, the
          // reference's rules: kv_stride, causal, window, pattern, block map, element mask).
          const auto visible = [&](int64_t j) {
            return j < keys && detail::reference_key_bias(p, policy, b, h, i, j, bias[j]);
          };
          const double* qi = &q_rows[i * d];
          const double* oi = &out_rows[i * dvd];
          const double* doi = &dout_rows[i * dvd];
          double row_max = neg_inf;
          for (int64_t j = 0; j < sk; ++j) {
            if (!visible(j)) continue;
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += qi[c] * k_rows[j * d + c];
            prob[j] = dot * scale + bias[j];
            row_max = std::max(row_max, prob[j]);
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          std::fill(dq_terms.begin(), dq_terms.end(), 0.0);
          if (row_max != neg_inf) {
            double sum = 0;
            for (int64_t j = 0; j < sk; ++j) {
              if (!visible(j)) continue;
              prob[j] = std::exp(prob[j] - row_max);
              sum += prob[j];
            }
            double delta = 0;
            for (int64_t c = 0; c < dvd; ++c) delta += doi[c] * oi[c];
            for (int64_t j = 0; j < sk; ++j) {
              if (!visible(j)) continue;
              prob[j] /= sum;
              const double p_rounded = round_to_dtype(t, prob[j]);
              const double* vj = &v_rows[j * dvd];
              double dp = 0;
              for (int64_t c = 0; c < dvd; ++c) {
                const double g = doi[c];
                dp += g * vj[c];
                dv[j * dvd + c] += p_rounded * g;
                dv_terms[j * dvd + c] += prob[j] * std::fabs(g);
              }
              const double ds_exact = prob[j] * (dp - delta);
              // dS cancels (to 0 when a row sees one key): its rounding error scales with the
              // terms before the cancellation, P (|dP| + |D|), D coming from the rounded output.
              const double ds_terms = prob[j] * (std::fabs(dp) + std::fabs(delta));
              const double ds_rounded = round_to_dtype(t, ds_exact);
              const double* kj = &k_rows[j * d];
              for (int64_t c = 0; c < d; ++c) {
                const double kv = kj[c], qv = qi[c];
                dq[c] += ds_rounded * kv;
                dq_terms[c] += ds_terms * std::fabs(kv);
                dk[j * d + c] += ds_rounded * qv;
                dk_terms[j * d + c] += ds_terms * std::fabs(qv);
              }
            }
          }
          const int64_t out_row = at(bp.dq_strides, b, h, i);
          for (int64_t c = 0; c < d; ++c) {
            r.dq.set(out_row + c, scale * dq[c]);
            r.dq_terms[out_row + c] = std::fabs(scale) * dq_terms[c];
          }
        }
      }
      for (int64_t j = 0; j < sk; ++j) {
        const int64_t krow = at(bp.dk_strides, b, hk, j), vrow = at(bp.dv_strides, b, hk, j);
        for (int64_t c = 0; c < d; ++c) {
          r.dk.set(krow + c, scale * dk[j * d + c]);
          r.dk_terms[krow + c] = std::fabs(scale) * dk_terms[j * d + c];
        }
        for (int64_t c = 0; c < dvd; ++c) {
          r.dv.set(vrow + c, dv[j * dvd + c]);
          r.dv_terms[vrow + c] = dv_terms[j * dvd + c];
        }
      }
    }
  }
  return r;
}

// The rule above for one gradient: `got` the kernel's, `ref` the fp64 reference's (rounded to the
// dtype, as the test reads it), `rounded` and `terms` from rounded_backward, `floor` the atol
// scale of the dtype rule (the size of the summed terms' largest possible value).
inline ::testing::AssertionResult within_backward_rule(const HostTensor& got, const HostTensor& ref,
                                                       const HostTensor& rounded,
                                                       const std::vector<double>& terms,
                                                       DType dtype, double floor) {
  const Tolerance tol = tolerance_for(dtype);
  const double u = unit_roundoff_16(dtype);
  double scale = floor, err = 0, rounded_err = 0, max_terms = 0;
  for (int64_t i = 0; i < ref.size(); ++i) scale = std::max(scale, std::fabs(ref.get(i)));
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < ref.size(); ++i) {
    const double r = ref.get(i), o = got.get(i);
    if (std::isnan(r) || std::isnan(o)) {  // the inputs are finite: NaN is a bug
      if (bad++ == 0) first = "element " + std::to_string(i) + " is NaN";
      continue;
    }
    err = std::max(err, std::fabs(o - r));
    rounded_err = std::max(rounded_err, std::fabs(rounded.get(i) - r));
    max_terms = std::max(max_terms, terms[i]);
    const double bound = tol.rtol * std::fabs(r) + tol.atol * scale + 2 * u * terms[i];
    if (std::fabs(o - r) > bound && bad++ == 0) {
      first = "element " + std::to_string(i) + ": got " + std::to_string(o) + ", expected " +
              std::to_string(r) + ", same-dtype reference " + std::to_string(rounded.get(i)) +
              ", bound " + std::to_string(bound);
    }
  }
  const double fa3_bound = 2 * rounded_err + u * max_terms;
  if (bad == 0 && err <= fa3_bound) return ::testing::AssertionSuccess();
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  if (bad > 0) {
    failure << bad << " of " << ref.size() << " elements out of the element-wise bound; first "
            << first << ". ";
  }
  failure << "max error " << err << " vs FA3 bound 2 * " << rounded_err << " + u * " << max_terms
          << " = " << fa3_bound;
  return failure;
}

}  // namespace samattn::testing
