// The tensor-core forward (fp16/bf16, and float32 in TF32, on sm80+) against the fp64 reference,
// and the backend selection. The tensor-core path rounds P (and, in TF32, the inputs) before its
// products, so its bound follows FlashAttention-3: max|out - ref| <= 2 * max|emulated - ref| +
// atol, where `emulated` is the fp64 reference with the same roundings done on the host
// (low_precision_reference below).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention/key_split.h"
#include "common/check.h"
#include "common/device.h"
#include "common/host_float.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

bool tensor_cores_available() {
  if (!gpu_available()) return false;
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

#define SKIP_WITHOUT_TENSOR_CORES()                                                          \
  do {                                                                                       \
    if (!tensor_cores_available()) GTEST_SKIP() << "no CUDA GPU of compute capability 8.0+"; \
  } while (0)

// Round to nearest, ties away from zero, to a 10-bit mantissa: what cvt.rna.tf32.f32 does.
double round_to_tf32(double x) {
  const float f = static_cast<float>(x);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  bits = (bits + 0x1000u) & ~0x1fffu;
  float rounded;
  std::memcpy(&rounded, &bits, sizeof(rounded));
  return rounded;
}

// The type the tensor-core path rounds operands to: the input type, or TF32 for float32.
double round_operand(DType dtype, double x) {
  return dtype == DType::kFloat32 ? round_to_tf32(x) : round_to_dtype(dtype, x);
}

// Rows [0, rows) of a (B, H, S, D) host tensor's slice (b, h), each element rounded to the
// operand type, as contiguous doubles: rounded once per slice rather than once per product.
std::vector<double> operand_rows(const HostTensor& t, DType dtype, const Strides& s, int64_t b,
                                 int64_t h, int64_t rows, int64_t cols) {
  std::vector<double> out =
      detail::rows_as_double(t.data(), dtype, b * s.batch + h * s.head, s.seq, rows, cols);
  for (double& x : out) x = round_operand(dtype, x);
  return out;
}

struct Emulated {
  HostTensor out;
  std::vector<double> lse;
};

// The fp64 reference with the tensor-core path's roundings: inputs rounded to the operand type
// (a no-op for fp16/bf16), P = exp(s - max) (unnormalised, in (0, 1]) rounded to it before it
// multiplies V, the row sum over the unrounded P, the output rounded to the input type. Scores
// of rounded operands are exact in double.
// window_right >= 0: also a window's right edge (query i sees positions j <= i + window_right).
// key_terms: a key mask's additive terms (natural log, -inf hides), (batch, seqlen_k).
// pb.params.mask's cache_seqlens (host memory) and causal_lower_right apply too: entry b's keys
// are its first cache_seqlens[b], and bottom-right causal aligns to them; so does a window's left
// edge that follows it (window_follows_causal).
Emulated low_precision_reference(const Problem& pb, int64_t window_right = -1,
                                 const std::vector<double>* key_terms = nullptr) {
  const AttentionParams& p = pb.params;
  const double scale = p.softmax_scale ? *p.softmax_scale : default_softmax_scale(p.head_dim);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t qk_dim = p.head_dim, v_dim = p.head_dim_v;
  Emulated result{HostTensor(pb.dtype, pb.out.size()), {}};
  std::vector<double> scores(p.seqlen_k), accum(p.head_dim_v);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t keys = p.mask.cache_seqlens != nullptr ? p.mask.cache_seqlens[b] : p.seqlen_k;
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      const std::vector<double> q =
          operand_rows(pb.q, pb.dtype, p.q_strides, b, h, p.seqlen_q, qk_dim);
      const std::vector<double> k =
          operand_rows(pb.k, pb.dtype, p.k_strides, b, hk, p.seqlen_k, qk_dim);
      const std::vector<double> v =
          operand_rows(pb.v, pb.dtype, p.v_strides, b, hk, p.seqlen_k, v_dim);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const auto visible = [&](int64_t j) {
          const bool masked = key_terms && (*key_terms)[b * p.seqlen_k + j] == -INFINITY;
          const bool follows = p.mask.window_follows_causal && p.mask.window_left >= 0;
          return j < keys && j % p.kv_stride == 0 && (!p.causal || j <= i) &&
                 (!p.mask.causal_lower_right || j <= i + keys - p.seqlen_q) &&
                 (!follows || j >= i + keys - p.seqlen_q - p.mask.window_left) &&
                 (window_right < 0 || j <= i + window_right) && !masked;
        };
        double row_max = neg_inf;
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (!visible(j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < qk_dim; ++d) dot += q[i * qk_dim + d] * k[j * qk_dim + d];
          scores[j] = dot * scale + (key_terms ? (*key_terms)[b * p.seqlen_k + j] : 0.0);
          if (std::isnan(scores[j]) || scores[j] > row_max) row_max = scores[j];
        }
        std::fill(accum.begin(), accum.end(), 0.0);
        double sum = 0;
        if (row_max != neg_inf) {
          for (int64_t j = 0; j < p.seqlen_k; ++j) {
            if (!visible(j)) continue;
            const double weight = std::exp(scores[j] - row_max);
            const double rounded = round_operand(pb.dtype, weight);
            sum += weight;
            for (int64_t d = 0; d < v_dim; ++d) accum[d] += rounded * v[j * v_dim + d];
          }
        }
        const int64_t o = b * p.out_strides.batch + h * p.out_strides.head + i * p.out_strides.seq;
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          result.out.set(o + d, sum == 0 ? 0 : accum[d] / sum);
        }
        result.lse.push_back(sum == 0 ? neg_inf : row_max + std::log(sum));
      }
    }
  }
  return result;
}

// Unit roundoff of the operand type: the absolute slack of the bound, scaled by max|ref| (FA3
// uses twice the rounding error of values near 0.3, about the same).
double unit_roundoff(DType dtype) {
  return dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // fp16, TF32
}

::testing::AssertionResult within_fa3_bound(const HostTensor& out, const HostTensor& emulated,
                                            const HostTensor& ref, DType dtype) {
  double scale = 0, err = 0, emulated_err = 0;
  for (int64_t i = 0; i < ref.size(); ++i) {
    const double r = ref.get(i), o = out.get(i);
    if (std::isnan(r) != std::isnan(o)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << o << ", expected " << r << " (NaN mismatch)";
    }
    if (std::isnan(r)) continue;
    scale = std::max(scale, std::fabs(r));
    err = std::max(err, std::fabs(o - r));
    emulated_err = std::max(emulated_err, std::fabs(emulated.get(i) - r));
  }
  const double bound = 2 * emulated_err + unit_roundoff(dtype) * scale;
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max error " << err << " exceeds 2 * " << emulated_err << " + atol = " << bound;
}

std::vector<Scenario> scenarios() {
  std::vector<Scenario> list;
  for (int64_t d : {32, 64, 96, 128, 192, 256}) {
    const std::string dim = "d" + std::to_string(d);
    list.push_back({"dense_" + dim, {2, 3, 3, 77, 129, d, d}});
    list.push_back({"causal_" + dim, {1, 2, 2, 129, 129, d, d}, true});
    list.push_back({"causal_sq_gt_sk_" + dim, {1, 2, 2, 200, 77, d, d}, true});
  }
  list.push_back({"long_1000", {1, 2, 2, 1000, 1000, 128, 128}, false, 1, false, 0.3});
  list.push_back({"long_1000_causal", {1, 2, 2, 1000, 1000, 64, 64}, true});
  list.push_back({"causal_sq_lt_sk", {1, 2, 2, 77, 300, 64, 64}, true});
  list.push_back({"sq_lt_sk", {2, 2, 2, 129, 1000, 96, 96}});
  list.push_back({"single_query", {3, 2, 2, 1, 1000, 128, 128}});
  list.push_back({"single_query_causal", {3, 2, 2, 1, 77, 64, 64}, true});
  list.push_back({"seqlen_1", {2, 2, 2, 1, 1, 32, 32}});
  list.push_back({"kv_stride4", {1, 2, 2, 200, 333, 64, 64}, false, 4});
  list.push_back({"kv_stride4_causal", {1, 2, 2, 257, 257, 128, 128}, true, 4});
  list.push_back({"gqa_8to1", {2, 8, 1, 130, 140, 128, 128}});
  list.push_back({"gqa_8to1_causal", {1, 8, 1, 140, 140, 64, 64}, true});
  list.push_back({"seq_major", {2, 4, 2, 150, 170, 64, 64}, false, 1, true});
  list.push_back({"seq_major_causal", {1, 4, 4, 129, 129, 128, 128}, true, 1, true});
  list.push_back({"negative_scale", {1, 2, 2, 70, 90, 64, 64}, false, 1, false, -0.2});
  list.push_back({"no_keys", {1, 2, 2, 10, 0, 64, 64}});
  return list;
}

std::vector<Case> all_cases() {
  return cases_in({DType::kFloat16, DType::kBFloat16, DType::kFloat32}, scenarios());
}

// Runs `pb` on the device with `backend`; returns the output and (float) lse per row.
HostTensor run_on_device(const Problem& pb, Backend backend, std::vector<double>* lse_out) {
  DeviceProblem dp(pb);
  const int64_t rows = pb.shape.batch * pb.shape.heads_q * pb.shape.seqlen_q;
  DeviceBuffer lse(rows * sizeof(float));
  if (rows > 0) EXPECT_EQ(cudaMemset(lse.get(), 0xff, rows * sizeof(float)), cudaSuccess);
  AttentionParams p = dp.pb.params;
  p.lse = lse_out != nullptr ? lse.get() : nullptr;
  p.backend = backend;
  attention_forward(p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(pb.dtype, pb.out.size());
  dp.out.download(got.data());
  if (lse_out != nullptr) {
    std::vector<float> lse32(rows);
    lse.download(lse32.data());
    lse_out->assign(lse32.begin(), lse32.end());
  }
  return got;
}

// Runs case `c` with `backend` and checks the output against the FA3-rule bound and lse against
// the fp64 reference.
void check_against_reference(const Case& c, Backend backend) {
  const Scenario& sc = c.scenario;
  const DType dtype = c.dtype;
  Problem pb(sc.shape, dtype, sc.seq_major, sc.seed());
  sc.apply_options(pb.params);
  pb.params.allow_tf32 = true;  // float32 runs in TF32
  const HostTensor expected = pb.reference(/*with_lse=*/true);
  const Emulated emulated = low_precision_reference(pb);

  std::vector<double> lse;
  const HostTensor got = run_on_device(pb, backend, &lse);
  EXPECT_TRUE(within_fa3_bound(got, emulated.out, expected, dtype));
  // fp16/bf16 scores are exact products summed in fp32, so lse matches the fp64 reference; TF32
  // rounds q and k first, so lse is held to the reference on the rounded inputs.
  const std::vector<double>& lse_ref = dtype == DType::kFloat32 ? emulated.lse : pb.lse;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      EXPECT_EQ(lse[i], lse_ref[i]) << "row " << i;
    } else {
      EXPECT_NEAR(lse[i], lse_ref[i], 1e-5 * (1 + std::fabs(lse_ref[i]))) << "row " << i;
    }
  }
}

class TensorCoreGpu : public ::testing::TestWithParam<Case> {};

TEST_P(TensorCoreGpu, MatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  check_against_reference(GetParam(), Backend::kTensorCore);
}

INSTANTIATE_TEST_SUITE_P(AllShapes, TensorCoreGpu, ::testing::ValuesIn(all_cases()), case_name);

// Key masks of the split tests, (B, 1, 1, Sk): none; bool padding (a length per batch entry,
// the second entry's 0: rows that see no key); float32 terms in [-2, 2] with every 7th key -inf;
// terms in the inputs' dtype.
enum class KeyMask { kNone, kBoolPadding, kFloat32, kInputDType };

// NaN where the call must not look: none; in every key row the key mask hides (a padded cache's
// unwritten rows); as the float key mask's term of the last key, which a right edge of
// seqlen_k - seqlen_q hides from every query but the last.
enum class Poison { kNone, kKeysBehindMask, kTermOfLastKey };

// Runs `p` (dp's device copies, lse and workspace poisoned first) and checks the output against
// the FlashAttention-3 bound and the lse against the fp64 reference's (pb.lse, -inf exactly).
void run_and_check(AttentionParams p, const DeviceProblem& dp, const Problem& pb,
                   const Emulated& emulated, const HostTensor& expected) {
  const int64_t rows = static_cast<int64_t>(pb.lse.size());
  DeviceBuffer lse(rows * sizeof(float));
  ASSERT_EQ(cudaMemset(lse.get(), 0xff, rows * sizeof(float)), cudaSuccess);
  p.lse = lse.get();
  DeviceBuffer workspace(attention_forward_workspace_bytes(p));
  p.workspace = workspace.get();
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(pb.dtype, pb.out.size());
  dp.out.download(got.data());
  EXPECT_TRUE(within_fa3_bound(got, emulated.out, expected, pb.dtype));
  std::vector<float> lse32(rows);
  lse.download(lse32.data());
  for (int64_t i = 0; i < rows; ++i) {
    if (std::isinf(pb.lse[i])) {
      EXPECT_EQ(lse32[i], pb.lse[i]) << "row " << i;
    } else {
      EXPECT_NEAR(lse32[i], pb.lse[i], 1e-5 * (1 + std::fabs(pb.lse[i]))) << "row " << i;
    }
  }
}

// A split call: num_splits, a window's right edge (bottom-right causal: seqlen_k - seqlen_q),
// optionally the output in (B, S, H, D) storage, a key mask and NaN poison.
struct SplitScenario {
  const char* name;
  Shape shape;
  bool seq_major;
  int64_t kv_stride, num_splits;
  int64_t window_right = -1;
  bool out_seq_major = false;
  KeyMask key_mask = KeyMask::kNone;
  Poison poison = Poison::kNone;
  bool cache_lengths = false;  // mask.cache_seqlens (cache_lengths_of), k and v rows past them NaN
  bool lower_right = false;    // mask.causal_lower_right
  int64_t follows_left = -1;   // >= 0: a window's left edge following bottom-right causal
};

// Per-entry key lengths of a cache_lengths scenario: the whole cache, a third of it plus one, an
// empty entry, five keys, repeated over the batch.
std::vector<int32_t> cache_lengths_of(const AttentionParams& p) {
  std::vector<int32_t> lengths(p.batch);
  const int32_t keys = static_cast<int32_t>(p.seqlen_k);
  const int32_t pattern[] = {keys, keys / 3 + 1, 0, std::min(keys, 5)};
  for (int64_t b = 0; b < p.batch; ++b) lengths[b] = pattern[b % 4];
  return lengths;
}

// The key mask of `kind` for `p` in `host` (its dtype's bytes) and its additive terms.
MaskDType make_key_mask(const AttentionParams& p, KeyMask kind, std::vector<unsigned char>& host,
                        std::vector<double>& terms) {
  const int64_t count = p.batch * p.seqlen_k;
  terms.assign(count, 0.0);
  if (kind == KeyMask::kBoolPadding) {
    host.assign(count, 0);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t length = b == 1 ? 0 : p.seqlen_k / 3 + b * 97 % (p.seqlen_k / 2 + 1) + 1;
      for (int64_t j = 0; j < p.seqlen_k; ++j) {
        host[b * p.seqlen_k + j] = j < length;
        if (j >= length) terms[b * p.seqlen_k + j] = -INFINITY;
      }
    }
    return MaskDType::kBool;
  }
  const DType dtype = kind == KeyMask::kFloat32 ? DType::kFloat32 : p.dtype;
  HostTensor values(dtype, count);
  std::mt19937_64 engine(41);
  std::uniform_real_distribution<double> uniform(-2.0, 2.0);
  for (int64_t i = 0; i < count; ++i) {
    values.set(i, i % 7 == 3 ? -INFINITY : uniform(engine));
    terms[i] = values.get(i);
  }
  host = values.bytes;
  return dtype == DType::kFloat32   ? MaskDType::kFloat32
         : dtype == DType::kFloat16 ? MaskDType::kFloat16
                                    : MaskDType::kBFloat16;
}

// Runs `sc` split (the chunks on the decoding kernel exactly when `decoding`) and checks the
// output against the unsplit kernel's bound and lse against the fp64 reference.
void check_split_call(const SplitScenario& sc, DType dtype, bool decoding) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + "/" + sc.name);
  Problem pb(sc.shape, dtype, sc.seq_major, 31);
  pb.params.kv_stride = sc.kv_stride;
  pb.params.mask.window_right = sc.window_right;
  pb.params.mask.causal_lower_right = sc.lower_right;
  pb.params.mask.window_follows_causal = sc.follows_left >= 0;
  pb.params.mask.window_left = sc.follows_left;
  const std::vector<int32_t> lengths =
      sc.cache_lengths ? cache_lengths_of(pb.params) : std::vector<int32_t>{};
  if (sc.cache_lengths) {
    pb.params.mask.cache_seqlens = lengths.data();
    poison_rows_past_lengths(pb, lengths);
  }
  if (sc.out_seq_major) {
    const Shape& s = sc.shape;
    pb.params.out_strides = {s.seqlen_q * s.heads_q * s.head_dim_v, s.head_dim_v,
                             s.heads_q * s.head_dim_v};
  }
  std::vector<unsigned char> mask_bytes;
  std::vector<double> key_terms;
  if (sc.key_mask != KeyMask::kNone) {
    MaskOptions& m = pb.params.mask;
    m.dtype = make_key_mask(pb.params, sc.key_mask, mask_bytes, key_terms);
    m.data = mask_bytes.data();
    m.batch_stride = pb.params.seqlen_k;
    m.head_stride = m.row_stride = 0;
    m.col_stride = 1;
  }
  const AttentionParams& hp = pb.params;
  for (int64_t b = 0; sc.poison == Poison::kKeysBehindMask && b < hp.batch; ++b) {
    for (int64_t j = 0; j < hp.seqlen_k; ++j) {
      if (key_terms[b * hp.seqlen_k + j] != -INFINITY) continue;
      for (int64_t h = 0; h < hp.heads_kv; ++h) {
        for (int64_t d = 0; d < hp.head_dim; ++d) {
          pb.k.set(b * hp.k_strides.batch + h * hp.k_strides.head + j * hp.k_strides.seq + d,
                   std::nan(""));
        }
      }
    }
  }
  if (sc.poison == Poison::kTermOfLastKey) {
    for (int64_t b = 0; b < hp.batch; ++b) {
      const int64_t last = b * hp.seqlen_k + hp.seqlen_k - 1;
      key_terms[last] = std::nan("");
      const float nan = std::nanf("");
      std::memcpy(mask_bytes.data() + last * sizeof(float), &nan, sizeof(float));
    }
  }
  const HostTensor expected = pb.reference(/*with_lse=*/true);
  const Emulated emulated = low_precision_reference(
      pb, sc.window_right, sc.key_mask != KeyMask::kNone ? &key_terms : nullptr);
  DeviceProblem dp(pb);
  DeviceBuffer mask(mask_bytes.size());
  if (!mask_bytes.empty()) {
    ASSERT_EQ(cudaMemcpy(mask.get(), mask_bytes.data(), mask_bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    dp.pb.params.mask.data = mask.get();
  }
  DeviceBuffer device_lengths(lengths.size() * sizeof(int32_t));
  if (!lengths.empty()) {
    ASSERT_EQ(cudaMemcpy(device_lengths.get(), lengths.data(), lengths.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    dp.pb.params.mask.cache_seqlens = static_cast<const int32_t*>(device_lengths.get());
  }
  AttentionParams p = dp.pb.params;
  p.num_splits = sc.num_splits;
  const detail::KeySplit split = detail::key_split_for(p);
  ASSERT_GT(split.parts(), 0) << "the call must split";
  ASSERT_EQ(split.on_decode_kernel, decoding);
  const size_t workspace_bytes = attention_forward_workspace_bytes(p);
  EXPECT_EQ(workspace_bytes > 0, detail::split_needs_workspace(split));
  EXPECT_EQ(select_backend(p), Backend::kTensorCore);
  EXPECT_EQ(describe_forward(p),
            detail::concat("tensor_core: ", decoding ? "decoding kernel" : "split", ", ",
                           split.parts(), split.parts() == 1 ? " key chunk" : " key chunks"));
  DeviceBuffer workspace(workspace_bytes);
  const int64_t rows = sc.shape.batch * sc.shape.heads_q * sc.shape.seqlen_q;
  DeviceBuffer lse(rows * sizeof(float));
  ASSERT_EQ(cudaMemset(lse.get(), 0xff, rows * sizeof(float)), cudaSuccess);
  p.workspace = workspace_bytes > 0 ? workspace.get() : nullptr;
  p.lse = lse.get();
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(dtype, pb.out.size());
  dp.out.download(got.data());
  EXPECT_TRUE(within_fa3_bound(got, emulated.out, expected, dtype));
  std::vector<float> lse32(rows);
  lse.download(lse32.data());
  for (int64_t i = 0; i < rows; ++i) {
    if (std::isnan(pb.lse[i])) {
      EXPECT_TRUE(std::isnan(lse32[i])) << "row " << i;
    } else if (std::isinf(pb.lse[i])) {
      EXPECT_EQ(lse32[i], pb.lse[i]) << "row " << i;
    } else {
      EXPECT_NEAR(lse32[i], pb.lse[i], 1e-5 * (1 + std::fabs(pb.lse[i]))) << "row " << i;
    }
  }
}

// Split-key attention (attention/key_split.h): the chunks on the tensor-core kernel and the
// merge, for calls the decoding kernel does not take (head dims, kv_stride, rows).
TEST(KeySplitGpu, MatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  const SplitScenario scenarios[] = {
      {"rows_gqa_kv_stride3_d96", {1, 4, 2, 5, 1777, 96, 96}, false, 3, 4},
      {"tail_of_one_key_d32", {1, 2, 1, 3, 257, 32, 32}, false, 1, 2},
      {"rows_d256", {1, 2, 2, 70, 900, 256, 256}, false, 1, 3},
      {"decode_d192_kv_stride2_many_chunks", {1, 2, 1, 1, 5000, 192, 192}, true, 2, 1000},
      {"right_edge_kv_stride2_d64", {1, 4, 4, 9, 2001, 64, 64}, false, 2, 4, 1500},
      {"rows_past_the_decoding_kernel_d128", {1, 4, 1, 17, 1000, 128, 128}, false, 1, 3},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const SplitScenario& sc : scenarios) check_split_call(sc, dtype, false);
  }
}

// The decoding kernel (attention/decode.h): every query row of a kv head in one block, chunks
// merged by the split's merge, or one chunk written directly.
TEST(DecodeKernelGpu, MatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  const SplitScenario scenarios[] = {
      {"gqa_4to1_seq_major", {2, 8, 2, 1, 3000, 128, 128}, true, 1, 0},
      {"one_row_d64", {3, 4, 4, 1, 1000, 64, 64}, false, 1, 7},
      {"drafts_lower_right_gqa", {2, 8, 2, 5, 3000, 128, 128}, true, 1, 0, 2995},
      {"drafts_lower_right_seq_major_out", {1, 8, 2, 5, 777, 64, 64}, true, 1, 3, 772, true},
      // 64 rows (4 tiles, one phase), 48 rows (3 tiles, a warp that only loads), 17 rows
      // (2 tiles, two phases), 16 rows (one tile, four phases).
      {"mqa_64_rows", {1, 32, 1, 2, 1500, 128, 128}, true, 1, 5},
      {"rows_48_d64", {2, 16, 2, 6, 900, 64, 64}, false, 1, 4},
      {"rows_17_right_edge", {1, 17, 1, 1, 2000, 128, 128}, false, 1, 3, 1999},
      {"rows_16", {1, 16, 1, 1, 1234, 64, 64}, true, 1, 0},
      // Right edges; one chunk (written directly, no merge) where the keys are few.
      // r = 62: the second 64-key chunk holds key 64, which only the last of 3 queries sees.
      {"right_edge_hides_a_chunk", {1, 4, 2, 3, 5000, 128, 128}, false, 1, 8, 62},
      {"right_edge_zero", {2, 2, 1, 4, 300, 64, 64}, false, 1, 2, 0},
      {"keys_fewer_than_a_tile", {2, 4, 2, 1, 37, 128, 128}, false, 1, 0},
      {"one_key", {1, 2, 2, 1, 1, 64, 64}, true, 1, 0},
      {"more_chunks_asked_than_tiles", {4, 8, 8, 1, 777, 128, 128}, true, 1, 1000000},
      {"many_chunks", {1, 2, 1, 1, 20000, 64, 64}, false, 1, 1000},
      // Head dims 96, 192, 256.
      {"d96_gqa_drafts", {2, 8, 2, 3, 1500, 96, 96}, true, 1, 0, 1497},
      {"d192_many_chunks", {1, 2, 1, 1, 5000, 192, 192}, true, 1, 1000},
      {"d256_rows_32", {1, 16, 2, 4, 2222, 256, 256}, false, 1, 5},
      // Key masks: a padded batch (one entry all padding), float32 and input-dtype terms.
      {"padded_batch_gqa",
       {4, 8, 2, 1, 3000, 128, 128},
       true,
       1,
       0,
       -1,
       false,
       KeyMask::kBoolPadding},
      {"padded_drafts_lower_right",
       {3, 8, 2, 5, 1000, 64, 64},
       true,
       1,
       4,
       995,
       false,
       KeyMask::kBoolPadding},
      {"float32_terms", {2, 4, 1, 1, 777, 128, 128}, false, 1, 3, -1, false, KeyMask::kFloat32},
      {"input_dtype_terms_one_chunk",
       {2, 4, 4, 1, 100, 64, 64},
       false,
       1,
       0,
       -1,
       false,
       KeyMask::kInputDType},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const SplitScenario& sc : scenarios) check_split_call(sc, dtype, true);
  }
}

// Per-entry key lengths (cache_seqlens) read on the device: chunks past an entry's length do
// nothing, the rows past it are NaN and never read; bottom-right causal aligned to each entry's
// own length (mask.causal_lower_right), with a window's right edge and a key mask on top.
TEST(DecodeKernelGpu, CacheLengthsMatchReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  SplitScenario scenarios[] = {
      {"cache_lengths_gqa", {4, 8, 2, 1, 3000, 128, 128}, true, 1, 0},
      // num_splits 1 (the default): the kernel still runs the call, as one chunk.
      {"cache_lengths_unsplit_default", {4, 8, 2, 1, 700, 128, 128}, true, 1, 1},
      {"cache_lengths_drafts_lower_right", {4, 8, 2, 5, 1000, 64, 64}, true, 1, 4},
      {"cache_lengths_lower_right_one_chunk", {4, 4, 4, 3, 100, 128, 128}, false, 1, 0},
      {"cache_lengths_lower_right_right_edge", {4, 8, 2, 4, 900, 64, 64}, false, 1, 3, 500},
      {"cache_lengths_lower_right_float_terms",
       {4, 8, 2, 2, 900, 64, 64},
       true,
       1,
       3,
       -1,
       false,
       KeyMask::kFloat32},
      {"cache_lengths_d256", {4, 8, 1, 1, 2000, 256, 256}, false, 1, 0},
      {"lower_right_without_lengths", {2, 8, 2, 5, 3000, 128, 128}, true, 1, 0},
  };
  for (SplitScenario& sc : scenarios) {
    const std::string name = sc.name;
    sc.cache_lengths = name.find("cache_lengths") == 0;
    sc.lower_right = name.find("lower_right") != std::string::npos;
  }
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const SplitScenario& sc : scenarios) check_split_call(sc, dtype, true);
  }
}

// A paged cache (block_table): the dense cache's rows scattered over a pool of shuffled pages
// (spare pages NaN), read by the decoding kernel through the table; page sizes that are a tile
// (64), larger (256), smaller (16, 1) and not a power of two (100), so a tile spans pages.
TEST(DecodeKernelGpu, PagedCacheMatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  struct PagedCase {
    const char* name;
    Shape shape;
    bool lower_right;
    int64_t num_splits, page_size;
    int64_t follows_left = -1;  // >= 0: sliding-window decoding
  };
  const PagedCase cases[] = {
      {"page_16_split", {4, 8, 2, 1, 1000, 128, 128}, false, 0, 16},
      {"page_256_one_chunk", {4, 8, 2, 1, 1000, 128, 128}, false, 1, 256},
      {"page_100_drafts_lower_right", {4, 8, 2, 4, 777, 64, 64}, true, 4, 100},
      {"page_1_d96", {2, 4, 4, 1, 300, 96, 96}, false, 3, 1},
      {"page_64_d256", {4, 8, 1, 1, 500, 256, 256}, false, 0, 64},
      // Sliding-window decoding: chunks starting mid-page.
      {"page_16_window_300_drafts", {4, 8, 2, 3, 1000, 128, 128}, true, 4, 16, 300},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const PagedCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + "/" + c.name);
      Problem pb(c.shape, dtype, true, 43);
      const std::vector<int32_t> lengths = cache_lengths_of(pb.params);
      pb.params.mask.cache_seqlens = lengths.data();
      pb.params.mask.causal_lower_right = c.lower_right;
      pb.params.mask.window_follows_causal = c.follows_left >= 0;
      pb.params.mask.window_left = c.follows_left;
      const HostTensor expected = pb.reference(/*with_lse=*/true);
      const Emulated emulated = low_precision_reference(pb);
      PagedCopy paged = scatter_into_pages(pb, c.page_size, 7);
      DeviceProblem dp(pb);
      DeviceBuffer k_pool(paged.k), v_pool(paged.v);
      DeviceBuffer table(paged.table.size() * sizeof(int32_t));
      DeviceBuffer device_lengths(lengths.size() * sizeof(int32_t));
      ASSERT_EQ(cudaMemcpy(table.get(), paged.table.data(), paged.table.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(device_lengths.get(), lengths.data(), lengths.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      AttentionParams p = dp.pb.params;
      bind_pages(p, paged, c.page_size);
      p.k = k_pool.get();
      p.v = v_pool.get();
      p.mask.block_table = static_cast<const int32_t*>(table.get());
      p.mask.cache_seqlens = static_cast<const int32_t*>(device_lengths.get());
      p.num_splits = c.num_splits;
      EXPECT_NE(describe_forward(p).find("decoding kernel"), std::string::npos)
          << describe_forward(p);
      run_and_check(p, dp, pb, emulated, expected);
      // A call the decoding kernel does not take is refused with the reason, before any launch.
      p.causal = true;
      p.mask.causal_lower_right = false;
      p.mask.window_follows_causal = false;
      try {
        attention_forward(p, nullptr);
        ADD_FAILURE() << "a paged call off the decoding kernel must be refused";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("runs on the decoding kernel only"), std::string::npos)
            << e.what();
      }
    }
  }
}

// A page stride that is not a multiple of 16 bytes is refused before any launch, also with one
// batch entry (the kernel steps by it between pages, whatever the batch).
TEST(DecodeKernelGpu, PagedCacheWithAMisalignedPageStrideIsRefused) {
  SKIP_WITHOUT_TENSOR_CORES();
  DeviceProblem dp(Shape{1, 8, 1, 1, 32, 128, 128}, DType::kFloat16);
  const int64_t page_size = 16, pages = 2, page_stride = page_size * 128 + 4;  // 8 mod 16 bytes
  DeviceBuffer pool(pages * page_stride * 2), table(2 * sizeof(int32_t)), lengths(sizeof(int32_t));
  const int32_t table_host[] = {1, 0}, lengths_host[] = {20};
  ASSERT_EQ(cudaMemcpy(table.get(), table_host, sizeof(table_host), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lengths.get(), lengths_host, sizeof(lengths_host), cudaMemcpyHostToDevice),
            cudaSuccess);
  AttentionParams p = dp.pb.params;
  p.k = p.v = pool.get();
  p.k_strides = p.v_strides = {page_stride, 128, 128};
  p.mask.block_table = static_cast<const int32_t*>(table.get());
  p.mask.block_table_stride = 2;
  p.mask.page_size = page_size;
  p.mask.num_pages = pages;
  p.mask.cache_seqlens = static_cast<const int32_t*>(lengths.get());
  try {
    attention_forward(p, nullptr);
    ADD_FAILURE() << "a misaligned page stride must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k batch stride"), std::string::npos) << e.what();
  }
}

// cache_seqlens where the decoding kernel does not run the call (num_splits 1, rows past it):
// one call per batch entry on the kernel the entry picks (the Hopper forward on sm_90).
TEST(CacheSeqlensGpu, PerEntryCallsMatchReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const bool lower_right : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (lower_right ? " lower_right" : ""));
      Problem pb({4, 4, 2, 128, 1000, 128, 128}, dtype, true, 41);
      pb.params.mask.causal_lower_right = lower_right;
      const std::vector<int32_t> lengths = cache_lengths_of(pb.params);
      pb.params.mask.cache_seqlens = lengths.data();
      poison_rows_past_lengths(pb, lengths);  // rows never read
      const HostTensor expected = pb.reference(/*with_lse=*/true);
      const Emulated emulated = low_precision_reference(pb);
      DeviceProblem dp(pb);
      DeviceBuffer device_lengths(lengths.size() * sizeof(int32_t));
      ASSERT_EQ(cudaMemcpy(device_lengths.get(), lengths.data(), lengths.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      AttentionParams p = dp.pb.params;
      p.mask.cache_seqlens = static_cast<const int32_t*>(device_lengths.get());
      EXPECT_NE(describe_forward(p).find("one call per batch entry"), std::string::npos)
          << describe_forward(p);
      run_and_check(p, dp, pb, emulated, expected);
    }
  }
}

// Sliding-window decoding: a left edge following bottom-right causal, the chunks starting at each
// entry's first row's window; with cache_seqlens (NaN past the lengths), drafts, a key mask.
TEST(DecodeKernelGpu, SlidingWindowMatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  SplitScenario scenarios[] = {
      {"window_1000_one_query_split", {2, 8, 2, 1, 3000, 128, 128}, true, 1, 0},
      {"window_70_drafts_lengths", {4, 8, 2, 5, 1000, 64, 64}, true, 1, 4},
      {"window_0_drafts_lengths_one_chunk", {4, 8, 2, 3, 700, 128, 128}, false, 1, 2},
      {"window_130_one_chunk_lengths_float_terms",
       {4, 8, 2, 2, 900, 64, 64},
       true,
       1,
       1,
       -1,
       false,
       KeyMask::kFloat32},
      {"window_1000_d256_lengths", {4, 8, 1, 1, 2000, 256, 256}, false, 1, 0},
      {"window_600_split_lengths_bool_padding",
       {4, 8, 2, 2, 900, 64, 64},
       false,
       1,
       4,
       -1,
       false,
       KeyMask::kBoolPadding},
  };
  const int64_t lefts[] = {1000, 70, 0, 130, 1000, 600};
  for (size_t i = 0; i < std::size(scenarios); ++i) {
    scenarios[i].lower_right = true;
    scenarios[i].follows_left = lefts[i];
    scenarios[i].cache_lengths =
        std::string(scenarios[i].name).find("lengths") != std::string::npos;
  }
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const SplitScenario& sc : scenarios) check_split_call(sc, dtype, true);
  }
}

// One chunk, planned where the (batch, kv head) blocks fill the device: no workspace, the
// output and lse written by the kernel itself.
TEST(DecodeKernelGpu, FullDeviceRunsOneChunkWithoutWorkspace) {
  SKIP_WITHOUT_TENSOR_CORES();
  const int64_t batch = detail::current_device_info().multiprocessors * 8;
  const SplitScenario sc{"full_device", {batch, 4, 1, 1, 200, 64, 64}, true, 1, 0};
  check_split_call(sc, DType::kBFloat16, true);
  Problem pb(sc.shape, DType::kBFloat16, true, 7);
  AttentionParams p = pb.params;
  p.num_splits = 0;
  EXPECT_EQ(detail::key_split_for(p).parts(), 1);
  EXPECT_EQ(attention_forward_workspace_bytes(p), 0u);
}

// NaN where the reference never looks stays out of the output: key rows behind a padded
// batch's mask (the scores there are NaN, the mask's -inf must win), and a float mask's NaN term
// at a key the right edge hides (it poisons only the last query, which sees that key).
TEST(DecodeKernelGpu, NanBehindTheMaskStaysHidden) {
  SKIP_WITHOUT_TENSOR_CORES();
  const SplitScenario scenarios[] = {
      {"nan_keys_behind_padding",
       {3, 8, 2, 1, 700, 64, 64},
       true,
       1,
       3,
       -1,
       false,
       KeyMask::kBoolPadding,
       Poison::kKeysBehindMask},
      {"nan_keys_behind_padding_d128_many_chunks",
       {3, 8, 2, 1, 700, 128, 128},
       false,
       1,
       1000000,
       -1,
       false,
       KeyMask::kBoolPadding,
       Poison::kKeysBehindMask},
      {"nan_term_behind_the_right_edge",
       {2, 4, 2, 2, 500, 64, 64},
       false,
       1,
       2,
       498,
       false,
       KeyMask::kFloat32,
       Poison::kTermOfLastKey},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const SplitScenario& sc : scenarios) check_split_call(sc, dtype, true);
  }
}

TEST(DecodeKernelGpu, NanInOneQueryPoisonsOnlyItsRow) {
  SKIP_WITHOUT_TENSOR_CORES();
  Problem pb({1, 4, 1, 1, 700, 64, 64}, DType::kBFloat16, false, 5);
  pb.q.set(2 * 64 + 9, std::nan(""));  // query head 2
  DeviceProblem dp(pb);
  AttentionParams p = dp.pb.params;
  p.num_splits = 4;
  ASSERT_TRUE(detail::key_split_for(p).on_decode_kernel);
  DeviceBuffer workspace(attention_forward_workspace_bytes(p));
  p.workspace = workspace.get();
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(DType::kBFloat16, pb.out.size());
  dp.out.download(got.data());
  for (int64_t h = 0; h < 4; ++h) {
    for (int64_t d = 0; d < 64; ++d) {
      EXPECT_EQ(std::isnan(got.get(h * 64 + d)), h == 2) << "head " << h << " dim " << d;
    }
  }
}

// Without the workspace a split call runs as with num_splits 1: the same bytes.
TEST(KeySplitGpu, WithoutWorkspaceRunsUnsplit) {
  SKIP_WITHOUT_TENSOR_CORES();
  Problem pb({1, 8, 2, 1, 3000, 128, 128}, DType::kBFloat16, true, 32);
  DeviceProblem dp(pb);
  AttentionParams p = dp.pb.params;
  HostTensor unsplit(DType::kBFloat16, pb.out.size()), fallback(DType::kBFloat16, pb.out.size());
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dp.out.download(unsplit.data());
  ASSERT_EQ(cudaMemset(dp.out.get(), 0xff, unsplit.bytes.size()), cudaSuccess);
  p.num_splits = 0;
  ASSERT_GT(attention_forward_workspace_bytes(p), 0u) << "the call would split";
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dp.out.download(fallback.data());
  EXPECT_EQ(fallback.bytes, unsplit.bytes);
}

TEST(TensorCoreGpuRuns, NanInOneQueryPoisonsOnlyItsRow) {
  SKIP_WITHOUT_TENSOR_CORES();
  Problem pb({1, 1, 1, 40, 100, 64, 64}, DType::kBFloat16);
  pb.q.set(5 * 64 + 3, std::nan(""));  // query row 5
  const HostTensor got = run_on_device(pb, Backend::kTensorCore, nullptr);
  for (int64_t i = 0; i < 40; ++i) {
    for (int64_t d = 0; d < 64; ++d) {
      EXPECT_EQ(std::isnan(got.get(i * 64 + d)), i == 5) << "row " << i << " dim " << d;
    }
  }
}

TEST(TensorCoreGpuRuns, RerunsAreBitIdentical) {
  SKIP_WITHOUT_TENSOR_CORES();
  Problem pb({2, 4, 4, 300, 300, 128, 128}, DType::kFloat16);
  pb.params.causal = true;
  const HostTensor first = run_on_device(pb, Backend::kTensorCore, nullptr);
  const HostTensor second = run_on_device(pb, Backend::kTensorCore, nullptr);
  EXPECT_EQ(first.bytes, second.bytes);
}

// Restores SAMATTN_FORCE_SIMT when a test that sets it ends.
class ScopedForceSimt {
 public:
  explicit ScopedForceSimt(const char* value) {
    if (const char* old = std::getenv("SAMATTN_FORCE_SIMT")) saved_ = old;
    setenv("SAMATTN_FORCE_SIMT", value, 1);
  }
  ~ScopedForceSimt() {
    if (saved_) {
      setenv("SAMATTN_FORCE_SIMT", saved_->c_str(), 1);
    } else {
      unsetenv("SAMATTN_FORCE_SIMT");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(SelectBackend, PicksTensorCoresForSupportedCalls) {
  SKIP_WITHOUT_GPU();
  DeviceProblem dp({1, 2, 2, 64, 64, 64, 64});
  const Backend expected = hopper_skip_reason().empty() ? Backend::kHopper
                           : tensor_cores_available()   ? Backend::kTensorCore
                                                        : Backend::kSimt;
  EXPECT_EQ(select_backend(dp.pb.params), expected);
  dp.pb.params.backend = Backend::kSimt;
  EXPECT_EQ(select_backend(dp.pb.params), Backend::kSimt);
}

TEST(SelectBackend, UnsupportedHeadDimFallsBackToSimt) {
  Problem pb({1, 2, 2, 16, 16, 72, 72}, DType::kFloat16);
  EXPECT_EQ(select_backend(pb.params), Backend::kSimt);
  Problem mixed({1, 2, 2, 16, 16, 64, 32}, DType::kBFloat16);
  EXPECT_EQ(select_backend(mixed.params), Backend::kSimt);
  // describe_forward names the family alone where nothing splits.
  pb.params.num_splits = 0;
  EXPECT_EQ(describe_forward(pb.params), "simt");
}

TEST(SelectBackend, Float32StaysOnSimtWithoutTf32) {
  Problem pb({1, 2, 2, 16, 16, 64, 64}, DType::kFloat32);
  EXPECT_EQ(select_backend(pb.params), Backend::kSimt);
  pb.params.backend = Backend::kTensorCore;
  EXPECT_THROW(select_backend(pb.params), Error);
}

TEST(SelectBackend, Float32WithTf32UsesTensorCores) {
  SKIP_WITHOUT_GPU();
  DeviceProblem dp({1, 2, 2, 64, 64, 64, 64}, DType::kFloat32);
  dp.pb.params.allow_tf32 = true;
  const Backend expected = tensor_cores_available() ? Backend::kTensorCore : Backend::kSimt;
  EXPECT_EQ(select_backend(dp.pb.params), expected);
}

TEST(SelectBackend, EnvironmentForcesSimt) {
  Problem pb({1, 2, 2, 16, 16, 64, 64}, DType::kFloat16);
  const ScopedForceSimt force("1");
  EXPECT_EQ(select_backend(pb.params), Backend::kSimt);
  pb.params.backend = Backend::kTensorCore;
  EXPECT_EQ(select_backend(pb.params), Backend::kSimt);
}

TEST(SelectBackend, ForcingTensorCoresOnUnsupportedHeadDimThrows) {
  Problem pb({1, 2, 2, 16, 16, 72, 72}, DType::kFloat16);
  pb.params.backend = Backend::kTensorCore;
  try {
    select_backend(pb.params);
    FAIL() << "expected samattn::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("backend tensor_core does not support head_dim 72 "
                        "(supported: 32, 64, 96, 128, 192, 256)"),
              std::string::npos)
        << error.what();
  }
}

TEST(SelectBackend, MisalignedStridesFallBackToSimt) {
  SKIP_WITHOUT_TENSOR_CORES();
  // Rows 68 elements apart (136 bytes): not a multiple of 16 bytes.
  Shape shape{1, 2, 2, 50, 60, 64, 64};
  Problem pb(shape, DType::kFloat16);
  HostTensor wide_q(DType::kFloat16, 2 * 50 * 68);
  fill_random(wide_q, 7);
  pb.q = wide_q;
  pb.params.q_strides = Strides{2 * 50 * 68, 50 * 68, 68};
  const HostTensor expected = pb.reference();
  DeviceProblem dp(shape);
  DeviceBuffer q(pb.q);
  AttentionParams p = pb.params;
  p.q = q.get();
  p.k = dp.k.get();
  p.v = dp.v.get();
  p.out = dp.out.get();
  dp.k.upload(pb.k);
  dp.v.upload(pb.v);
  EXPECT_EQ(select_backend(p), Backend::kSimt);
  p.backend = Backend::kTensorCore;
  EXPECT_THROW(select_backend(p), Error);
  p.backend = Backend::kAuto;
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(DType::kFloat16, pb.out.size());
  dp.out.download(got.data());
  EXPECT_TRUE(all_close(got, expected, DType::kFloat16));
}

// ---------------------------------------------------------------------------------------------
// The Hopper (sm_90a wgmma + TMA) forward: the same scenarios (restricted to its head dims, plus
// shapes that stress its tiles) against the same bound, and against the sm80 path.

bool is_hopper_head_dim(int64_t d) {
  return d == 64 || d == 96 || d == 128 || d == 192 || d == 256;
}

std::vector<Case> hopper_cases() {
  std::vector<Scenario> list;
  for (const Scenario& s : scenarios()) {
    if (is_hopper_head_dim(s.shape.head_dim)) list.push_back(s);
  }
  // Awkward extents for 128-row query tiles and 128- (or 64-) key stages: single rows, ragged
  // tails, Sq != Sk both ways, more key blocks than pipeline stages.
  for (int64_t d : {64, 96, 128, 192, 256}) {
    const std::string dim = "_d" + std::to_string(d);
    list.push_back({"seqlen_1" + dim, {2, 2, 2, 1, 1, d, d}});
    list.push_back({"sq1000_sk129" + dim, {1, 2, 2, 1000, 129, d, d}});
    list.push_back({"sq129_sk1000_causal" + dim, {1, 2, 2, 129, 1000, d, d}, true});
    list.push_back({"gqa_8to1_kv_stride3" + dim, {1, 8, 1, 77, 700, d, d}, false, 3});
    list.push_back({"seq_major_kv_stride4_causal" + dim, {2, 2, 2, 300, 300, d, d}, true, 4, true});
    // 300 rows in 128-row tiles: the causal tiles start 64 rows before row 0
    // (TileGeometry::tile_row_shift), so the first tile's warpgroup 0 has no row; its O is
    // staged and stored by TMA at head dims 64 to 192, from registers at 256 (one Q buffer).
    list.push_back({"causal_first_tile_shifted" + dim, {1, 2, 2, 300, 350, d, d}, true});
  }
  // Head dim 64's 192-row tiles at causal S = 1024: shifted by 128 rows, two idle warpgroups.
  list.push_back({"causal_1024_two_idle_warpgroups_d64", {1, 2, 1, 1024, 1024, 64, 64}, true});
  // The persistent grid (one block per SM, 132 on an H100): more work units than blocks with
  // short keys, causal pairs with an odd tile count per head, GQA 8:1 with kv_stride and causal
  // over many heads, and a single tile (a one-block grid).
  list.push_back({"persistent_many_tiles_d64", {3, 50, 50, 300, 40, 64, 64}});
  list.push_back({"persistent_many_tiles_d128", {3, 50, 50, 300, 40, 128, 128}});
  list.push_back({"persistent_causal_odd_tiles_d64", {2, 40, 40, 589, 589, 64, 64}, true, 4});
  list.push_back(
      {"persistent_gqa_8to1_stride2_causal_d128", {2, 64, 8, 300, 300, 128, 128}, true, 2});
  list.push_back({"persistent_many_heads_d256", {1, 150, 150, 130, 40, 256, 256}});
  list.push_back({"single_tile_d128", {1, 1, 1, 64, 64, 128, 128}});
  list.push_back({"single_tile_causal_d256", {1, 1, 1, 100, 100, 256, 256}, true});
  list.push_back({"long_1000_causal_d128", {1, 2, 2, 1000, 1000, 128, 128}, true});
  list.push_back({"single_query_sk1_causal_d128", {2, 3, 1, 1, 1, 128, 128}, true});
  return cases_in({DType::kFloat16, DType::kBFloat16}, list);
}

class HopperGpu : public ::testing::TestWithParam<Case> {};

TEST_P(HopperGpu, MatchesReference) {
  SKIP_WITHOUT_HOPPER();
  check_against_reference(GetParam(), Backend::kHopper);
}

INSTANTIATE_TEST_SUITE_P(AllShapes, HopperGpu, ::testing::ValuesIn(hopper_cases()), case_name);

// Both paths within the bound of the reference, and within twice the bound of each other.
TEST(HopperGpuRuns, AgreesWithTheSm80Path) {
  SKIP_WITHOUT_HOPPER();
  const Scenario list[] = {
      {"cross_dense", {2, 4, 2, 300, 500, 128, 128}},
      {"cross_causal", {1, 4, 4, 513, 513, 64, 64}, true},
      {"cross_d256", {1, 2, 2, 200, 333, 256, 256}, true, 2},
  };
  for (const Scenario& sc : list) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(sc.name + "/" + dtype_name(dtype));
      Problem pb(sc.shape, dtype, sc.seq_major, sc.seed());
      sc.apply_options(pb.params);
      const HostTensor expected = pb.reference();
      const Emulated emulated = low_precision_reference(pb);
      const HostTensor hopper = run_on_device(pb, Backend::kHopper, nullptr);
      const HostTensor sm80 = run_on_device(pb, Backend::kTensorCore, nullptr);
      EXPECT_TRUE(within_fa3_bound(hopper, emulated.out, expected, dtype));
      EXPECT_TRUE(within_fa3_bound(sm80, emulated.out, expected, dtype));
      double scale = 0, emulated_err = 0, diff = 0;
      for (int64_t i = 0; i < expected.size(); ++i) {
        scale = std::max(scale, std::fabs(expected.get(i)));
        emulated_err = std::max(emulated_err, std::fabs(emulated.out.get(i) - expected.get(i)));
        diff = std::max(diff, std::fabs(hopper.get(i) - sm80.get(i)));
      }
      EXPECT_LE(diff, 2 * (2 * emulated_err + unit_roundoff(dtype) * scale));
    }
  }
}

TEST(HopperGpuRuns, NanInOneQueryPoisonsOnlyItsRow) {
  SKIP_WITHOUT_HOPPER();
  Problem pb({1, 1, 1, 40, 300, 128, 128}, DType::kBFloat16);
  pb.q.set(5 * 128 + 3, std::nan(""));  // query row 5
  const HostTensor got = run_on_device(pb, Backend::kHopper, nullptr);
  for (int64_t i = 0; i < 40; ++i) {
    for (int64_t d = 0; d < 128; ++d) {
      EXPECT_EQ(std::isnan(got.get(i * 128 + d)), i == 5) << "row " << i << " dim " << d;
    }
  }
}

TEST(HopperGpuRuns, RerunsAreBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  Problem pb({2, 4, 4, 300, 300, 128, 128}, DType::kFloat16);
  pb.params.causal = true;
  const HostTensor first = run_on_device(pb, Backend::kHopper, nullptr);
  const HostTensor second = run_on_device(pb, Backend::kHopper, nullptr);
  EXPECT_EQ(first.bytes, second.bytes);
}

// Every head dim, causal, partial tiles (300 rows): the Hopper forward's output with and
// without `ablation` must be the same bytes.
void expect_ablation_bit_identical(const char* ablation) {
  for (int64_t d : {64, 96, 128, 192, 256}) {
    SCOPED_TRACE(d);
    Problem pb({2, 6, 3, 300, 400, d, d}, DType::kBFloat16);
    pb.params.causal = true;
    const HostTensor with = run_on_device(pb, Backend::kHopper, nullptr);
    const ScopedHopperAblation off(ablation);
    const HostTensor without = run_on_device(pb, Backend::kHopper, nullptr);
    EXPECT_EQ(with.bytes, without.bytes);
  }
}

// Ping-pong only orders the two warpgroups' GEMM issue; every tile does the same arithmetic.
TEST(HopperGpuRuns, PingPongOffIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("no_pingpong");
}

// The staged store only changes how O's bytes travel (through shared memory and a TMA store,
// or straight from the registers); the partial tiles take its clipping at seqlen_q.
TEST(HopperGpuRuns, StagedStoreOffIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("no_staged_store");
}

// A warpgroup that sees only the first half of its tile's first key block (the causal diagonal
// under a tile's first 64 rows: 300 x 400 causal has it at every tile's warpgroup 0, at the head
// dims with 128-key blocks, 64, 96 and 128) runs that block's softmax on those keys alone: the
// keys it leaves out are masked (probability exactly 0) in the whole block's, so the bytes are
// the same.
TEST(HopperGpuRuns, WideFirstBlockIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("wide_first_block");
}

// The tile lookahead only moves when the producer finds the next tile and issues its Q (a tile
// ahead, or at the boundary): the partial causal tiles above, then more work units than SMs, so
// blocks chain tiles of several units (causal pairs, and the 16-block tiles of 2k keys, where
// the lookahead runs on every tile), and grouped heads, every head dim with two Q buffers. Then
// S = 1050 (more units than SMs): each head's last tile has 26 rows, so its upper warpgroup
// computes no block and passes on all of them, between tiles whose O is staged; without its
// early release of the previous tile's buffer (start_tile) this hung.
TEST(HopperGpuRuns, TileLookaheadIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("no_lookahead");
  const Shape shapes[] = {{2, 16, 4, 1000, 2048, 0, 0}, {4, 16, 4, 1050, 1050, 0, 0}};
  for (int64_t d : {64, 128, 192}) {
    for (bool causal : {false, true}) {
      for (Shape shape : shapes) {
        SCOPED_TRACE(::testing::Message()
                     << "head dim " << d << " causal " << causal << " sq " << shape.seqlen_q);
        shape.head_dim = shape.head_dim_v = d;
        Problem pb(shape, DType::kBFloat16);
        pb.params.causal = causal;
        const HostTensor with = run_on_device(pb, Backend::kHopper, nullptr);
        const ScopedHopperAblation off("no_lookahead");
        EXPECT_EQ(run_on_device(pb, Backend::kHopper, nullptr).bytes, with.bytes);
      }
    }
  }
}

// The causal tail of single tiles only changes which block takes which tile and when: the same
// bytes as pairs to the end ("paired_tail"), for the partial causal tiles above (fewer units
// than SMs: every head in the tail) and for more units than SMs (the tail after the pairs, with
// the work counter and the static round robin), every head dim.
TEST(HopperGpuRuns, CausalTailOfSingleTilesIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("paired_tail");
  const Shape shapes[] = {{4, 16, 4, 1050, 1050, 0, 0}, {2, 16, 16, 2048, 2048, 0, 0}};
  for (int64_t d : {64, 128, 192, 256}) {
    for (Shape shape : shapes) {
      for (const std::string schedule : {"", "static_schedule,"}) {
        SCOPED_TRACE(::testing::Message()
                     << "head dim " << d << " sq " << shape.seqlen_q << " " << schedule);
        shape.head_dim = shape.head_dim_v = d;
        Problem pb(shape, DType::kBFloat16);
        pb.params.causal = true;
        auto run_with = [&](const std::string& ablation) {
          const ScopedHopperAblation scoped(ablation.c_str());
          return run_on_device(pb, Backend::kHopper, nullptr);
        };
        EXPECT_EQ(run_with(schedule + "paired_tail").bytes, run_with(schedule).bytes);
      }
    }
  }
}

// The short causal tile first (tiles shifted up to block_m - 64 rows before row 0) only changes
// which tile and warpgroup compute a row, not the row's arithmetic: each warpgroup still owns
// 64 rows starting at a multiple of 64, so its key blocks, masks and narrow first block are the
// same. The partial causal tiles above (shift 64 at every head dim), then head dim 64's
// 192-row tiles shifted by 128 (S = 1024) and by 64 (S = 2048), with more units than SMs,
// grouped heads, kv_stride 2 and Sq != Sk.
TEST(HopperGpuRuns, PartialFirstTileIsBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  expect_ablation_bit_identical("partial_last_tile");
  struct ShiftedCase {
    Shape shape;
    int64_t kv_stride;
  };
  const ShiftedCase cases[] = {{{2, 16, 4, 1024, 1024, 64, 64}, 1},
                               {{2, 8, 8, 2048, 2048, 64, 64}, 1},
                               {{2, 16, 4, 1050, 1050, 128, 128}, 1},
                               {{2, 8, 2, 1000, 2000, 64, 64}, 2},
                               {{1, 4, 4, 1100, 700, 192, 192}, 1}};
  for (const ShiftedCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "head dim " << c.shape.head_dim << " sq "
                                      << c.shape.seqlen_q << " kv_stride " << c.kv_stride);
    Problem pb(c.shape, DType::kBFloat16);
    pb.params.causal = true;
    pb.params.kv_stride = c.kv_stride;
    const HostTensor with = run_on_device(pb, Backend::kHopper, nullptr);
    const ScopedHopperAblation off("partial_last_tile");
    EXPECT_EQ(run_on_device(pb, Backend::kHopper, nullptr).bytes, with.bytes);
  }
}

// More work units than SMs, so the blocks take units from the stream's work counter (every head
// dim; causal pairs of unequal cost at head dim 64's 192-row tiles): the same bytes as the static
// round robin, on every rerun (each launch must leave the counter at zero for the next).
TEST(HopperGpuRuns, WorkCounterScheduleMatchesTheStaticOne) {
  SKIP_WITHOUT_HOPPER();
  for (int64_t d : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "head dim " << d << " causal " << causal);
      Problem pb({4, 16, 8, 1024, 1024, d, d}, DType::kBFloat16);
      pb.params.causal = causal;
      std::vector<uint8_t> static_bytes;
      {
        const ScopedHopperAblation off("static_schedule");
        static_bytes = run_on_device(pb, Backend::kHopper, nullptr).bytes;
      }
      for (int rerun = 0; rerun < 3; ++rerun) {
        EXPECT_EQ(run_on_device(pb, Backend::kHopper, nullptr).bytes, static_bytes) << rerun;
      }
    }
  }
}

// Captured into a CUDA graph (global mode, as torch.cuda.graph captures), where the launcher
// takes no work counter (a graph may be replayed on any stream) and runs the static schedule:
// every replay, its output poisoned before, writes the uncaptured call's bytes.
TEST(HopperGpuRuns, CapturedInAGraphWritesTheSameBytes) {
  SKIP_WITHOUT_HOPPER();
  Problem pb({4, 16, 8, 1024, 1024, 128, 128}, DType::kBFloat16);
  pb.params.causal = true;
  const std::vector<uint8_t> expected = run_on_device(pb, Backend::kHopper, nullptr).bytes;
  DeviceProblem dp(pb);
  dp.pb.params.backend = Backend::kHopper;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  attention_forward(dp.pb.params, stream);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t replay;
  ASSERT_EQ(cudaGraphInstantiate(&replay, graph, 0), cudaSuccess);
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemsetAsync(dp.out.get(), 0xff, expected.size(), stream), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(replay, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint8_t> got(expected.size());
    dp.out.download(got.data());
    EXPECT_EQ(got, expected) << "replay " << round;
  }
  EXPECT_EQ(cudaGraphExecDestroy(replay), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Two streams at once, each with its own work counter: every launch, its output poisoned in its
// stream just before, must write the static schedule's bytes.
TEST(HopperGpuRuns, WorkCountersOfTwoStreamsDoNotMix) {
  SKIP_WITHOUT_HOPPER();
  Problem first({4, 16, 8, 1024, 1024, 128, 128}, DType::kBFloat16);
  Problem second({2, 32, 32, 777, 1500, 64, 64}, DType::kBFloat16, false, 99);
  second.params.causal = true;
  std::vector<uint8_t> expected[2];
  {
    const ScopedHopperAblation off("static_schedule");
    expected[0] = run_on_device(first, Backend::kHopper, nullptr).bytes;
    expected[1] = run_on_device(second, Backend::kHopper, nullptr).bytes;
  }
  DeviceProblem problems[2] = {DeviceProblem(first), DeviceProblem(second)};
  cudaStream_t streams[2];
  for (cudaStream_t& stream : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 2; ++i) {
      DeviceProblem& dp = problems[i];
      dp.pb.params.backend = Backend::kHopper;
      ASSERT_EQ(cudaMemsetAsync(dp.out.get(), 0xff, expected[i].size(), streams[i]), cudaSuccess);
      attention_forward(dp.pb.params, streams[i]);
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(cudaStreamSynchronize(streams[i]), cudaSuccess);
      std::vector<uint8_t> got(expected[i].size());
      problems[i].out.download(got.data());
      EXPECT_EQ(got, expected[i]) << "round " << round << " stream " << i;
    }
  }
  for (cudaStream_t stream : streams) EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// The output as a view into a larger buffer: sequence-major, 16 bytes of padding after every
// (row, head) and more rows than seqlen_q. The view must get the bytes a dense output gets and
// every other byte must keep its value (the TMA store clips the last tile at seqlen_q).
TEST(HopperGpuRuns, OutputViewGetsTheDenseBytesAndNothingElseChanges) {
  SKIP_WITHOUT_HOPPER();
  constexpr uint16_t kSentinel = 0x7fa5;  // a bf16 NaN the kernel never writes
  for (int64_t d : {64, 96, 128, 192, 256}) {
    SCOPED_TRACE(d);
    const Shape shape{2, 3, 3, 300, 200, d, d};
    Problem pb(shape, DType::kBFloat16);
    pb.params.causal = true;
    const HostTensor dense = run_on_device(pb, Backend::kHopper, nullptr);
    const int64_t padded_dim = d + 8, rows = 320;
    const Strides view{rows * shape.heads_q * padded_dim, padded_dim, shape.heads_q * padded_dim};
    std::vector<uint16_t> buffer(shape.batch * view.batch, kSentinel);
    DeviceBuffer q(pb.q), k(pb.k), v(pb.v), out(buffer.size() * sizeof(uint16_t));
    ASSERT_EQ(cudaMemcpy(out.get(), buffer.data(), buffer.size() * sizeof(uint16_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    AttentionParams p = pb.params;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.out = out.get();
    p.out_strides = view;
    p.backend = Backend::kHopper;
    attention_forward(p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out.download(buffer.data());
    const auto* dense_bits = reinterpret_cast<const uint16_t*>(dense.data());
    int64_t wrong = 0;
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t s = 0; s < rows; ++s) {
        for (int64_t h = 0; h < shape.heads_q; ++h) {
          for (int64_t e = 0; e < padded_dim; ++e) {
            const uint16_t got = buffer[b * view.batch + s * view.seq + h * view.head + e];
            const bool inside = s < shape.seqlen_q && e < d;
            const uint16_t want =
                inside ? dense_bits[((b * shape.heads_q + h) * shape.seqlen_q + s) * d + e]
                       : kSentinel;
            if (got != want && wrong++ == 0) {
              ADD_FAILURE() << "batch " << b << " row " << s << " head " << h << " element " << e
                            << (inside ? " (in the view)" : " (outside the view)") << ": got 0x"
                            << std::hex << got << ", expected 0x" << want << std::dec;
            }
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Head dim 64 without the ping-pong: still within the bound of the reference.
TEST(HopperGpuRuns, AblationsStayWithinTheBound) {
  SKIP_WITHOUT_HOPPER();
  const ScopedHopperAblation off("no_pingpong");
  check_against_reference({{"ablated_d64", {2, 4, 2, 300, 500, 64, 64}}, DType::kFloat16},
                          Backend::kHopper);
}

TEST(HopperGpuRuns, UnknownAblationIsAnError) {
  SKIP_WITHOUT_HOPPER();
  const ScopedHopperAblation off("no_softmax");
  DeviceProblem dp({1, 1, 1, 16, 16, 64, 64}, DType::kBFloat16);
  dp.pb.params.backend = Backend::kHopper;
  try {
    attention_forward(dp.pb.params, nullptr);
    FAIL() << "expected samattn::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("SAMATTN_HOPPER_ABLATION"), std::string::npos)
        << error.what();
  }
}

TEST(SelectBackend, AutoPicksHopperOnSm90) {
  SKIP_WITHOUT_HOPPER();
  DeviceProblem dp({1, 2, 2, 64, 64, 128, 128}, DType::kBFloat16);
  EXPECT_EQ(select_backend(dp.pb.params), Backend::kHopper);
  // Head dims without a Hopper instantiation stay on the sm80 path.
  DeviceProblem d32({1, 2, 2, 64, 64, 32, 32}, DType::kBFloat16);
  EXPECT_EQ(select_backend(d32.pb.params), Backend::kTensorCore);
  const ScopedForceSimt force("1");
  EXPECT_EQ(select_backend(dp.pb.params), Backend::kSimt);
}

// Head dims 96 and 192 take the Hopper forward where it is built.
TEST(SelectBackend, HopperHeadDims96And192TakeHopper) {
  SKIP_WITHOUT_HOPPER();
  for (int64_t d : {96, 192}) {
    DeviceProblem dp({1, 2, 2, 64, 64, d, d}, DType::kBFloat16);
    EXPECT_EQ(select_backend(dp.pb.params), Backend::kHopper) << d;
  }
}

TEST(SelectBackend, ForcingHopperOnUnsupportedCallsThrows) {
  Problem pb({1, 2, 2, 16, 16, 32, 32}, DType::kFloat16);
  pb.params.backend = Backend::kHopper;
  try {
    select_backend(pb.params);
    FAIL() << "expected samattn::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("backend hopper does not support"), std::string::npos)
        << error.what();
  }
  Problem f32({1, 2, 2, 16, 16, 64, 64}, DType::kFloat32);
  f32.params.backend = Backend::kHopper;
  EXPECT_THROW(select_backend(f32.params), Error);
}

TEST(SelectBackend, MisalignedStridesNeverPickHopper) {
  SKIP_WITHOUT_HOPPER();
  // Rows 68 elements apart (136 bytes): TMA needs 16-byte multiples.
  DeviceProblem dp({1, 2, 2, 50, 60, 64, 64});
  dp.pb.params.q_strides = Strides{2 * 50 * 68, 50 * 68, 68};
  DeviceBuffer wide_q(2 * 50 * 68 * sizeof(uint16_t));
  dp.pb.params.q = wide_q.get();
  EXPECT_NE(select_backend(dp.pb.params), Backend::kHopper);
  dp.pb.params.backend = Backend::kHopper;
  EXPECT_THROW(select_backend(dp.pb.params), Error);
}

}  // namespace
}  // namespace samattn::testing
