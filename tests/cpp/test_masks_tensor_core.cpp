// Masks on the tensor cores (float16/bfloat16, sm80+): every mask option forced onto the masked
// kernels (backend kTensorCore), forward and backward, against the fp64 reference with the
// outputs poisoned. The kernels round P (and, backward, dS) to the dtype, so the bounds follow
// FlashAttention-3 (test_tensor_core_gpu.cpp, backward_rounding_model.h): the forward's max error
// is at most twice that of a same-dtype emulation that applies the same mask (the reference's
// reference_key_bias) plus u * max|ref|. Also: the strided pattern's decomposition (with its
// workspace) and its element-wise path (without) agree with the reference and with each other,
// and a mask equal to causal gives the causal kernel's output.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "attention/decode.h"
#include "attention/fixed_pattern.h"
#include "attention/hopper/forward_launch.h"
#include "attention/tensor_core/backward_config.h"
#include "backward_rounding_model.h"
#include "reference/reference_mask.h"
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

enum class ElementMask { kNone, kBool, kFloat };

struct TcMaskCase {
  std::string name;
  Shape shape;
  bool causal = false;
  int64_t kv_stride = 1;
  int64_t window_left = -1, window_right = -1;
  SparsePattern pattern = SparsePattern::kNone;
  int64_t block = 0, summary = 0;
  ElementMask element = ElementMask::kNone;
  int64_t map_q = 0, map_k = 0;  // block map sizes (0: none)
  bool workspace = true;         // give attention_forward its workspace (strided decomposition)
  bool deterministic = false;    // the backward's atomic-free dQ kernel
  bool lower_right = false;      // mask.causal_lower_right (bottom-right causal)
  std::vector<int32_t> cache_lengths = {};  // mask.cache_seqlens, one per batch entry (or none)
  bool window_follows = false;              // mask.window_follows_causal (with lower_right)
};

// gtest prints a failing parameter with this (not as raw bytes).
void PrintTo(const TcMaskCase& c, std::ostream* os) { *os << c.name; }

// Bottom-right causal (mask.causal_lower_right): the diagonal moved right by Sk - Sq, or left
// (the first Sq - Sk rows see no key: output 0, lse -inf, no gradient).
TcMaskCase lower_right(std::string name, Shape shape, int64_t kv_stride, int64_t left,
                       ElementMask element) {
  TcMaskCase t{std::move(name), shape};
  t.kv_stride = kv_stride;
  t.window_left = left;
  t.element = element;
  t.lower_right = true;
  return t;
}

std::vector<TcMaskCase> cases() {
  using SP = SparsePattern;
  std::vector<TcMaskCase> c = {
      {"window", {2, 2, 1, 150, 170, 64, 64}, false, 1, 20, 5},
      {"window_causal_d32", {1, 2, 2, 300, 300, 32, 32}, true, 1, 64, -1},
      {"window_kv_stride3", {1, 2, 2, 200, 260, 128, 128}, true, 3, 90, -1},
      // Rows 117-128 see no key (their window starts past the last key).
      {"window_sq_gt_sk", {1, 2, 2, 129, 77, 96, 96}, true, 1, 40, -1},
      // Keys 75-199 are seen by no query (first seen past the last query).
      {"window_sk_gt_sq", {1, 2, 2, 70, 200, 64, 64}, false, 1, 10, 5},
      {"strided_l32", {1, 2, 2, 260, 260, 64, 64}, false, 1, -1, -1, SP::kStrided, 32},
      {"strided_l100_d128", {1, 2, 2, 1000, 1000, 128, 128}, false, 1, -1, -1, SP::kStrided, 100},
      {"strided_gqa_seq1", {2, 4, 2, 1, 1, 64, 64}, false, 1, -1, -1, SP::kStrided, 8},
      {"strided_l128_s129", {1, 2, 2, 129, 129, 64, 64}, false, 1, -1, -1, SP::kStrided, 128},
      {"strided_l128_s77", {1, 2, 2, 77, 77, 64, 64}, false, 1, -1, -1, SP::kStrided, 128},
      {"strided_gqa", {2, 4, 2, 300, 300, 96, 96}, false, 1, -1, -1, SP::kStrided, 24},
      {"strided_sq_ne_sk", {1, 2, 2, 300, 170, 64, 64}, false, 1, -1, -1, SP::kStrided, 50},
      {"strided_window", {1, 2, 2, 400, 400, 64, 64}, false, 1, 150, -1, SP::kStrided, 40},
      {"fixed", {1, 2, 2, 260, 260, 128, 128}, false, 1, -1, -1, SP::kFixed, 64, 8},
      {"fixed_d256", {1, 1, 1, 200, 200, 256, 256}, false, 1, -1, -1, SP::kFixed, 50, 3},
      // The fixed pattern's register masking with kv_stride (positions n * 2) and a window.
      {"fixed_kv_stride2_window", {1, 2, 2, 200, 300, 64, 64}, false, 2, 90, -1, SP::kFixed, 48, 5},
      {"bool_mask",
       {2, 2, 2, 77, 129, 64, 64},
       false,
       1,
       -1,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kBool},
      {"bool_mask_causal_window",
       {1, 4, 2, 100, 100, 96, 96},
       true,
       1,
       30,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kBool},
      {"float_mask_d192",
       {1, 2, 2, 130, 70, 192, 192},
       false,
       1,
       -1,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kFloat},
      {"block_map",
       {2, 2, 2, 300, 333, 64, 64},
       false,
       1,
       -1,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kNone,
       48,
       80},
      // Map cells aligned with the 128 x 96 tiles (hdim 64): the listed blocks on the diagonal
      // are masked by row ranges, no mask tile.
      {"block_map_causal",
       {1, 2, 2, 300, 300, 64, 64},
       true,
       1,
       -1,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kNone,
       128,
       96},
      {"block_map_bool_causal",
       {1, 2, 1, 257, 257, 128, 128},
       true,
       1,
       -1,
       -1,
       SP::kNone,
       0,
       0,
       ElementMask::kBool,
       64,
       64},
  };
  // Bottom-right causal with a window, kv_stride and an element mask.
  c.push_back(
      lower_right("lower_right_sk_gt_sq", {2, 4, 2, 150, 300, 64, 64}, 1, -1, ElementMask::kNone));
  c.push_back(lower_right("lower_right_sq_gt_sk_window_d128", {1, 2, 2, 200, 90, 128, 128}, 1, 50,
                          ElementMask::kNone));
  c.push_back(lower_right("lower_right_kv_stride3_bool", {1, 2, 2, 100, 260, 96, 96}, 3, -1,
                          ElementMask::kBool));
  // Per-entry key lengths (cache_seqlens: one call per batch entry), rows past them poisoned:
  // with top-left causal, bottom-right causal aligned to each entry (an entry with fewer keys
  // than queries, an empty one), a window, kv_stride, an element mask and a block map.
  const auto with_lengths = [](TcMaskCase t, std::vector<int32_t> lengths) {
    t.name = "cache_lengths_" + t.name;
    t.cache_lengths = std::move(lengths);
    return t;
  };
  c.push_back(with_lengths({"causal", {4, 2, 2, 33, 100, 64, 64}, true}, {100, 37, 0, 64}));
  c.push_back(with_lengths(
      lower_right("lower_right_window_gqa", {4, 4, 2, 33, 100, 64, 64}, 1, 20, ElementMask::kNone),
      {100, 5, 0, 77}));
  c.push_back(with_lengths(lower_right("lower_right_d128_rows_past_decoding",
                                       {2, 4, 1, 65, 300, 128, 128}, 1, -1, ElementMask::kNone),
                           {300, 120}));
  c.push_back(with_lengths(lower_right("lower_right_kv_stride2_float", {3, 2, 2, 17, 99, 96, 96}, 2,
                                       -1, ElementMask::kFloat),
                           {99, 50, 3}));
  {
    TcMaskCase map{"block_map", {3, 2, 2, 70, 130, 64, 64}};
    map.map_q = 16;
    map.map_k = 32;
    c.push_back(with_lengths(map, {130, 33, 64}));
  }
  // The window following the bottom-right diagonal, alone and per batch entry (cache_seqlens).
  for (TcMaskCase t : {lower_right("window_follows_sk_gt_sq", {2, 4, 2, 40, 150, 64, 64}, 1, 30,
                                   ElementMask::kNone),
                       lower_right("window_follows_sq_gt_sk_d128", {1, 2, 2, 150, 90, 128, 128}, 1,
                                   25, ElementMask::kBool),
                       with_lengths(lower_right("window_follows", {3, 2, 1, 20, 100, 64, 64}, 1, 15,
                                                ElementMask::kNone),
                                    {100, 40, 7})}) {
    t.window_follows = true;
    t.window_right = 3;
    c.push_back(t);
  }
  TcMaskCase no_workspace = c[5];
  no_workspace.name = "strided_l100_d128_elementwise";
  no_workspace.workspace = false;
  no_workspace.deterministic = true;  // the backward masks element by element too
  c.push_back(no_workspace);
  for (const char* name :
       {"window_sq_gt_sk", "block_map_bool_causal", "fixed", "lower_right_sq_gt_sk_window_d128"}) {
    for (const TcMaskCase& base : std::vector<TcMaskCase>(c)) {
      if (base.name != name) continue;
      TcMaskCase det = base;
      det.name += "_deterministic";
      det.deterministic = true;
      c.push_back(det);
    }
  }
  return c;
}

// Host mask data of a case: a (B, 1, Sq, Sk) boolean or float mask broadcast over heads (~30%
// hidden, query row 3 fully hidden), and a (B, 1, ...) block map (~30% of blocks unlisted).
struct HostMasks {
  std::vector<uint8_t> bools;
  std::vector<float> floats;
  std::vector<uint8_t> map;
  std::vector<int32_t> lengths;  // cache_seqlens
};

HostMasks make_masks(const TcMaskCase& c, AttentionParams& p) {
  const Shape& s = c.shape;
  HostMasks m;
  std::mt19937_64 engine(std::hash<std::string>{}(c.name) + 11);
  if (c.element != ElementMask::kNone) {
    const int64_t n = s.batch * s.seqlen_q * s.seqlen_k;
    if (c.element == ElementMask::kBool) {
      m.bools.resize(n);
      for (auto& v : m.bools) v = (engine() % 10) >= 3;
    } else {
      std::normal_distribution<float> normal(0.f, 1.f);
      m.floats.resize(n);
      for (auto& v : m.floats) v = (engine() % 10) >= 3 ? normal(engine) : -INFINITY;
    }
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t j = 0; j < s.seqlen_k && s.seqlen_q > 3; ++j) {
        const int64_t at = (b * s.seqlen_q + 3) * s.seqlen_k + j;
        if (!m.bools.empty()) m.bools[at] = 0;
        if (!m.floats.empty()) m.floats[at] = -INFINITY;
      }
    }
    p.mask.dtype = c.element == ElementMask::kBool ? MaskDType::kBool : MaskDType::kFloat32;
    p.mask.batch_stride = s.seqlen_q * s.seqlen_k;
    p.mask.head_stride = 0;
    p.mask.row_stride = s.seqlen_k;
    p.mask.col_stride = 1;
  }
  m.lengths = c.cache_lengths;
  if (c.map_q > 0) {
    const int64_t rows = (s.seqlen_q + c.map_q - 1) / c.map_q;
    const int64_t cols = (s.seqlen_k + c.map_k - 1) / c.map_k;
    m.map.resize(s.batch * rows * cols);
    for (auto& v : m.map) v = (engine() % 10) >= 3;
    p.mask.block_q = c.map_q;
    p.mask.block_k = c.map_k;
    p.mask.block_batch_stride = rows * cols;
    p.mask.block_head_stride = 0;
    p.mask.block_row_stride = cols;
    p.mask.block_col_stride = 1;
  }
  return m;
}

void apply_options(const TcMaskCase& c, AttentionParams& p) {
  p.causal = c.causal;
  p.kv_stride = c.kv_stride;
  p.mask.window_left = c.window_left;
  p.mask.window_right = c.window_right;
  p.mask.pattern = c.pattern;
  p.mask.pattern_block = c.block;
  p.mask.pattern_summary = c.summary;
  p.mask.causal_lower_right = c.lower_right;
  p.mask.window_follows_causal = c.window_follows;
}

void bind_host_masks(AttentionParams& p, const HostMasks& m) {
  p.mask.data = !m.bools.empty()    ? static_cast<const void*>(m.bools.data())
                : !m.floats.empty() ? static_cast<const void*>(m.floats.data())
                                    : nullptr;
  p.mask.block_map = m.map.empty() ? nullptr : m.map.data();
  p.mask.cache_seqlens = m.lengths.empty() ? nullptr : m.lengths.data();
}

// The fp64 reference with the kernel's rounding of P (unnormalised, in (0, 1]) to the dtype
// before it multiplies V, the masks applied by the reference's own rules.
HostTensor rounded_forward(const Problem& pb) {
  const AttentionParams& p = pb.params;
  const double scale = p.softmax_scale ? *p.softmax_scale : default_softmax_scale(p.head_dim);
  HostTensor out(pb.dtype, pb.out.size());
  std::vector<double> score(p.seqlen_k), bias(p.seqlen_k), accum(p.head_dim_v);
  std::vector<bool> seen(p.seqlen_k);
  for (int64_t b = 0; b < p.batch; ++b) {
    // An entry's own keys (cache_seqlens), which bottom-right causal aligns to.
    const int64_t keys = p.mask.has_cache_seqlens() ? p.mask.cache_seqlens[b] : p.seqlen_k;
    const detail::MaskPolicy policy =
        detail::for_sequence(detail::make_mask_policy(p.causal, p.mask), p.seqlen_q, keys);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      // The slice's rows as doubles, converted once (host_float.h's rows_as_double).
      const int64_t qk_dim = p.head_dim, v_dim = p.head_dim_v;
      const std::vector<double> q = detail::rows_as_double(
          pb.q.data(), pb.dtype, b * p.q_strides.batch + h * p.q_strides.head, p.q_strides.seq,
          p.seqlen_q, qk_dim);
      const std::vector<double> k = detail::rows_as_double(
          pb.k.data(), pb.dtype, b * p.k_strides.batch + hk * p.k_strides.head, p.k_strides.seq,
          p.seqlen_k, qk_dim);
      const std::vector<double> v = detail::rows_as_double(
          pb.v.data(), pb.dtype, b * p.v_strides.batch + hk * p.v_strides.head, p.v_strides.seq,
          p.seqlen_k, v_dim);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        double row_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          seen[j] = j < keys && detail::reference_key_bias(p, policy, b, h, i, j, bias[j]);
          if (!seen[j]) continue;
          double dot = 0;
          for (int64_t d = 0; d < qk_dim; ++d) dot += q[i * qk_dim + d] * k[j * qk_dim + d];
          score[j] = dot * scale + bias[j];
          row_max = std::max(row_max, score[j]);
        }
        std::fill(accum.begin(), accum.end(), 0.0);
        double sum = 0;
        for (int64_t j = 0; j < p.seqlen_k && std::isfinite(row_max); ++j) {
          if (!seen[j]) continue;
          const double weight = std::exp(score[j] - row_max);
          sum += weight;
          const double rounded = round_to_dtype(pb.dtype, weight);
          for (int64_t d = 0; d < v_dim; ++d) accum[d] += rounded * v[j * v_dim + d];
        }
        const int64_t o = b * p.out_strides.batch + h * p.out_strides.head + i * p.out_strides.seq;
        for (int64_t d = 0; d < p.head_dim_v; ++d) out.set(o + d, sum == 0 ? 0 : accum[d] / sum);
      }
    }
  }
  return out;
}

::testing::AssertionResult within_fa3_bound(const HostTensor& out, const HostTensor& rounded,
                                            const HostTensor& ref, DType dtype) {
  double scale = 0, err = 0, rounded_err = 0;
  for (int64_t i = 0; i < ref.size(); ++i) {
    const double r = ref.get(i), o = out.get(i);
    if (std::isnan(o)) return ::testing::AssertionFailure() << "element " << i << " is NaN";
    scale = std::max(scale, std::fabs(r));
    err = std::max(err, std::fabs(o - r));
    rounded_err = std::max(rounded_err, std::fabs(rounded.get(i) - r));
  }
  const double bound = 2 * rounded_err + unit_roundoff_16(dtype) * scale;
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << " exceeds 2 * " << rounded_err
                                       << " + u * " << scale << " = " << bound;
}

// Device copies of a problem and its masks, the forward's outputs poisoned.
struct DeviceRun {
  DeviceBuffer q, k, v, out, lse, bools, floats, map, lengths;
  std::optional<DeviceBuffer> workspace;
  AttentionParams params;

  DeviceRun(const Problem& pb, const HostMasks& m, bool with_workspace)
      : q(pb.q),
        k(pb.k),
        v(pb.v),
        out(pb.out),
        lse(pb.shape.batch * pb.shape.heads_q * pb.shape.seqlen_q * sizeof(float)),
        bools(m.bools.size()),
        floats(m.floats.size() * sizeof(float)),
        map(m.map.size()),
        lengths(m.lengths.size() * sizeof(int32_t)) {
    params = pb.params;
    params.q = q.get();
    params.k = k.get();
    params.v = v.get();
    params.out = out.get();
    params.lse = lse.get();
    const size_t lse_bytes = pb.shape.batch * pb.shape.heads_q * pb.shape.seqlen_q * sizeof(float);
    if (lse_bytes > 0) {
      EXPECT_EQ(cudaMemset(lse.get(), 0xff, lse_bytes), cudaSuccess);
    }
    copy(bools, m.bools.data(), m.bools.size());
    copy(floats, m.floats.data(), m.floats.size() * sizeof(float));
    copy(map, m.map.data(), m.map.size());
    params.mask.data = !m.bools.empty() ? bools.get() : !m.floats.empty() ? floats.get() : nullptr;
    params.mask.block_map = m.map.empty() ? nullptr : static_cast<const uint8_t*>(map.get());
    copy(lengths, m.lengths.data(), m.lengths.size() * sizeof(int32_t));
    params.mask.cache_seqlens =
        m.lengths.empty() ? nullptr : static_cast<const int32_t*>(lengths.get());
    params.backend = Backend::kTensorCore;
    const size_t bytes = with_workspace ? attention_forward_workspace_bytes(params) : 0;
    if (bytes > 0) {
      workspace.emplace(bytes);
      params.workspace = workspace->get();
    }
  }

  static void copy(DeviceBuffer& dst, const void* src, size_t bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
};

// Runs the forward of `dev` and checks its output against the FlashAttention-3 bound and its lse
// against the reference's (-inf exactly where the reference has it).
void run_forward_and_check(const DeviceRun& dev, const Problem& pb, const HostTensor& ref,
                           const HostTensor& rounded, const std::string& name) {
  attention_forward(dev.params, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(pb.dtype, pb.out.size());
  dev.out.download(got.data());
  EXPECT_TRUE(within_fa3_bound(got, rounded, ref, pb.dtype)) << name;
  std::vector<float> lse(pb.lse.size());
  dev.lse.download(lse.data());
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(pb.lse[r])) {
      EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << r << " got " << lse[r];
    } else {
      EXPECT_NEAR(lse[r], pb.lse[r], 1e-5 * (1 + std::fabs(pb.lse[r]))) << "row " << r;
    }
  }
}

// The gtest name of a (case, dtype) parameter: "<dtype>_<case name>".
constexpr auto case_and_dtype_name = [](const auto& info) {
  return std::string(dtype_name(std::get<1>(info.param))) + "_" + std::get<0>(info.param).name;
};

class MaskTensorCore : public ::testing::TestWithParam<std::tuple<TcMaskCase, DType>> {};

TEST_P(MaskTensorCore, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  const auto& [c, dtype] = GetParam();
  Problem pb(c.shape, dtype, false, std::hash<std::string>{}(c.name));
  apply_options(c, pb.params);
  const HostMasks masks = make_masks(c, pb.params);
  bind_host_masks(pb.params, masks);
  poison_rows_past_lengths(pb, c.cache_lengths);
  const HostTensor ref = pb.reference(/*with_lse=*/true);
  const HostTensor rounded = rounded_forward(pb);

  DeviceRun dev(pb, masks, c.workspace);
  ASSERT_EQ(select_backend(dev.params), Backend::kTensorCore);
  if (!c.cache_lengths.empty()) {
    // Calls the decoding kernel takes (sliding-window decoding) run there, the others per entry.
    const bool decoding = detail::decode_kernel_takes(dev.params).ok();
    EXPECT_NE(describe_forward(dev.params)
                  .find(decoding ? "decoding kernel" : "one call per batch entry"),
              std::string::npos)
        << describe_forward(dev.params);
  }
  run_forward_and_check(dev, pb, ref, rounded, c.name);

  // Backward on the reference's output and lse: the fp64 reference backward vs the masked
  // tensor-core kernels (atomic dQ), every gradient poisoned first.
  HostTensor dout(dtype, pb.out.size()), dq(dtype, pb.q.size()), dk(dtype, pb.k.size()),
      dv(dtype, pb.v.size());
  fill_random(dout, 99);
  AttentionBackwardParams hb;
  hb.forward = pb.params;
  hb.forward.out = const_cast<void*>(ref.data());
  hb.dout = dout.data();
  hb.dout_strides = pb.params.out_strides;
  hb.dq_strides = pb.params.q_strides;
  hb.dk_strides = pb.params.k_strides;
  hb.dv_strides = pb.params.v_strides;
  hb.dq = dq.data();
  hb.dk = dk.data();
  hb.dv = dv.data();
  const RoundedBackward model = rounded_backward(hb, dq.size(), dk.size(), dv.size());
  reference_attention_backward(hb);

  std::vector<float> ref_lse(pb.lse.begin(), pb.lse.end());
  DeviceBuffer d_out(ref), d_dout(dout), d_lse(ref_lse.size() * sizeof(float)),
      d_dq(dq.bytes.size()), d_dk(dk.bytes.size()), d_dv(dv.bytes.size());
  DeviceRun::copy(d_lse, ref_lse.data(), ref_lse.size() * sizeof(float));
  for (auto* buffer : {&d_dq, &d_dk, &d_dv}) {
    HostTensor poison(dtype, 0);
    poison.bytes.assign(buffer == &d_dq   ? dq.bytes.size()
                        : buffer == &d_dk ? dk.bytes.size()
                                          : dv.bytes.size(),
                        0xff);
    buffer->upload(poison);
  }
  AttentionBackwardParams db = hb;
  db.forward = dev.params;
  // The tensor-core backward has head dims 32, 64, 96, 128, 192 and 256; others take SIMT, whose
  // error is within the same rule.
  db.forward.backend =
      tensor_core::is_backward_head_dim(c.shape.head_dim) ? Backend::kTensorCore : Backend::kAuto;
  db.deterministic = c.deterministic;
  db.forward.out = d_out.get();
  db.forward.lse = d_lse.get();
  db.dout = d_dout.get();
  db.dq = d_dq.get();
  db.dk = d_dk.get();
  db.dv = d_dv.get();
  DeviceBuffer workspace(attention_backward_workspace_bytes(db));
  db.workspace = workspace.get();
  attention_backward(db, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor gq(dtype, pb.q.size()), gk(dtype, pb.k.size()), gv(dtype, pb.v.size());
  d_dq.download(gq.data());
  d_dk.download(gk.data());
  d_dv.download(gv.data());
  const double scale = default_softmax_scale(c.shape.head_dim);
  const double dp = max_abs(dout) * max_abs(pb.v);
  EXPECT_TRUE(
      within_backward_rule(gq, dq, model.dq, model.dq_terms, dtype, scale * dp * max_abs(pb.k)))
      << "dq " << c.name;
  EXPECT_TRUE(
      within_backward_rule(gk, dk, model.dk, model.dk_terms, dtype, scale * dp * max_abs(pb.q)))
      << "dk " << c.name;
  EXPECT_TRUE(within_backward_rule(gv, dv, model.dv, model.dv_terms, dtype, max_abs(dout)))
      << "dv " << c.name;
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskTensorCore,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// Cross path: a boolean mask equal to causal runs the masked kernel's mask tile, the causal
// option the unmasked kernel; both round P the same way, so they agree to the output's rounding.
TEST(MaskTensorCoreCrossPath, CausalMaskEqualsCausalKernel) {
  SKIP_WITHOUT_TENSOR_CORES();
  const Shape s{1, 2, 2, 200, 200, 64, 64};
  Problem pb(s, DType::kBFloat16, false, 7);
  HostMasks masks;
  masks.bools.resize(s.seqlen_q * s.seqlen_k);
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    for (int64_t j = 0; j < s.seqlen_k; ++j) masks.bools[i * s.seqlen_k + j] = j <= i;
  }
  pb.params.mask.dtype = MaskDType::kBool;
  pb.params.mask.row_stride = s.seqlen_k;
  pb.params.mask.col_stride = 1;
  DeviceRun with_mask(pb, masks, true);
  attention_forward(with_mask.params, nullptr);
  Problem causal_pb(s, DType::kBFloat16, false, 7);
  causal_pb.params.causal = true;
  DeviceRun causal(causal_pb, HostMasks{}, true);
  attention_forward(causal.params, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor a(DType::kBFloat16, pb.out.size()), b(DType::kBFloat16, pb.out.size());
  with_mask.out.download(a.data());
  causal.out.download(b.data());
  EXPECT_TRUE(all_close(a, b, DType::kBFloat16));
}

// The sliding window on the Hopper forward (sm_90a; a window with kv_stride 1 is a per-row key
// range there): forced onto it, against the same bound and lse check as above. Every head dim;
// windows cut on both sides, rows and keys that see nothing, a span that starts in the middle of
// the keys (key blocks skipped on the left), GQA, and more tiles than SMs.
std::vector<TcMaskCase> hopper_window_cases() {
  std::vector<TcMaskCase> c = {
      {"window", {2, 2, 1, 150, 170, 64, 64}, false, 1, 20, 5},
      {"window_causal_d128", {1, 2, 2, 300, 300, 128, 128}, true, 1, 64, -1},
      {"window_sq_gt_sk", {1, 2, 2, 129, 77, 64, 64}, true, 1, 40, -1},
      {"window_sk_gt_sq", {1, 2, 2, 70, 200, 128, 128}, false, 1, 10, 5},
      {"window_right_only_d256", {1, 2, 2, 300, 260, 256, 256}, false, 1, -1, 30},
      {"window_wide_gqa_d128", {2, 8, 2, 700, 900, 128, 128}, false, 1, 300, 200},
      {"window_causal_many_tiles_d64", {2, 40, 40, 500, 500, 64, 64}, true, 1, 100, -1},
      {"window_causal_many_tiles_d128", {2, 40, 40, 500, 500, 128, 128}, true, 1, 100, -1},
      {"window_zero", {1, 2, 2, 257, 257, 128, 128}, false, 1, 0, 0},
      {"window_causal_d96", {1, 2, 2, 300, 300, 96, 96}, true, 1, 64, -1},
      {"window_d192", {1, 2, 2, 300, 260, 192, 192}, false, 1, 50, 30},
  };
  // Bottom-right causal runs as the window's per-row key range.
  c.push_back(lower_right("lower_right_sk_gt_sq_d128", {2, 4, 2, 150, 700, 128, 128}, 1, -1,
                          ElementMask::kNone));
  c.push_back(lower_right("lower_right_sq_gt_sk_window_d64", {1, 2, 2, 400, 130, 64, 64}, 1, 60,
                          ElementMask::kNone));
  // The window following the bottom-right diagonal (FlashAttention's window_size).
  for (TcMaskCase t : {lower_right("window_follows_sk_gt_sq_d128", {2, 4, 2, 150, 700, 128, 128}, 1,
                                   100, ElementMask::kNone),
                       lower_right("window_follows_sq_gt_sk_d64", {1, 2, 2, 400, 130, 64, 64}, 1,
                                   60, ElementMask::kNone)}) {
    t.window_follows = true;
    c.push_back(t);
  }
  return c;
}

// Problem pb with its host masks (possibly none) forced onto the Hopper forward, after checking
// that the default dispatch takes the same path, against the reference.
void check_hopper_forward(Problem& pb, const HostMasks& masks, const std::string& name) {
  bind_host_masks(pb.params, masks);
  const HostTensor ref = pb.reference(/*with_lse=*/true);
  const HostTensor rounded = rounded_forward(pb);

  DeviceRun dev(pb, masks, false);
  dev.params.backend = Backend::kHopper;
  ASSERT_EQ(select_backend(dev.params), Backend::kHopper);
  dev.params.backend = Backend::kAuto;  // the default dispatch takes the same path
  ASSERT_EQ(select_backend(dev.params), Backend::kHopper);
  run_forward_and_check(dev, pb, ref, rounded, name);
}

class MaskHopper : public ::testing::TestWithParam<std::tuple<TcMaskCase, DType>> {};

TEST_P(MaskHopper, WindowForwardMatchesReference) {
  SKIP_WITHOUT_HOPPER();
  const auto& [c, dtype] = GetParam();
  Problem pb(c.shape, dtype, false, std::hash<std::string>{}(c.name));
  apply_options(c, pb.params);
  check_hopper_forward(pb, HostMasks{}, c.name);
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskHopper,
                         ::testing::Combine(::testing::ValuesIn(hopper_window_cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// Block maps on the Hopper forward (a tile walks the key blocks the map lists for any of its
// rows; a consumer warpgroup masks a walked block its own map row does not list): forced onto
// it and taken by the default dispatch, against the same bound and lse check. Map rows of 64
// (several per tile) and 128 rows (a 192-row tile spans two), map columns of one and of two key
// blocks, causal, a window on top, more tiles than SMs (GQA; map rows of 64 under 192-row
// tiles), every head dim (256 with its 80-key blocks), and a map row with nothing listed (its
// rows get zeros and lse = -inf).
std::vector<TcMaskCase> hopper_block_map_cases() {
  using SP = SparsePattern;
  auto with_map = [](std::string name, Shape shape, bool causal, int64_t map_q, int64_t map_k,
                     int64_t window_left = -1, int64_t window_right = -1) {
    return TcMaskCase{std::move(name), shape,     causal, 1, window_left,
                      window_right,    SP::kNone, 0,      0, ElementMask::kNone,
                      map_q,           map_k};
  };
  return {
      with_map("map_d128", {2, 4, 2, 700, 650, 128, 128}, false, 128, 128),
      with_map("map_causal_d64", {1, 2, 2, 1000, 1000, 64, 64}, true, 128, 128),
      with_map("map_q64_k256_causal_d128", {1, 2, 1, 500, 777, 128, 128}, true, 64, 256),
      with_map("map_window_d64", {1, 2, 2, 600, 600, 64, 64}, false, 64, 128, 200, 50),
      with_map("map_many_tiles_gqa_d128", {2, 16, 2, 640, 640, 128, 128}, true, 128, 128),
      with_map("map_q64_many_tiles_causal_d64", {2, 24, 24, 640, 640, 64, 64}, true, 64, 128),
      with_map("map_k160_d256", {1, 2, 2, 300, 320, 256, 256}, false, 64, 160),
      with_map("map_causal_d96", {1, 2, 2, 500, 500, 96, 96}, true, 128, 128),
      with_map("map_k160_causal_d192", {1, 2, 2, 330, 330, 192, 192}, true, 64, 160),
      // Over 128 key blocks: the list warp's masks take several words and read rounds. Head
      // dim 64's 192-row tile has two warpgroups in map row 0 and one in row 1; the 8-row second
      // tile has warpgroups without rows.
      with_map("map_long_keys_d64", {1, 2, 2, 200, 20000, 64, 64}, false, 128, 128),
      with_map("map_long_keys_k256_d128", {1, 1, 1, 256, 20000, 128, 128}, false, 128, 256),
      // A window far along the keys: the last tiles' key blocks start past the masks' first
      // word (n_first >= 32), so the list warp writes only their words and the others keep an
      // earlier tile's bits.
      with_map("map_window_far_keys_d128", {1, 1, 1, 4500, 4500, 128, 128}, false, 128, 128, 300,
               0),
  };
}

class MaskHopperBlockMap : public ::testing::TestWithParam<std::tuple<TcMaskCase, DType>> {};

TEST_P(MaskHopperBlockMap, ForwardMatchesReference) {
  SKIP_WITHOUT_HOPPER();
  const auto& [c, dtype] = GetParam();
  Problem pb(c.shape, dtype, false, std::hash<std::string>{}(c.name));
  apply_options(c, pb.params);
  HostMasks masks = make_masks(c, pb.params);
  // Map row 1 of batch 0 lists nothing: its rows see no key.
  const int64_t map_rows = (c.shape.seqlen_q + c.map_q - 1) / c.map_q;
  if (map_rows > 1) {
    for (int64_t j = 0; j < pb.params.mask.block_row_stride; ++j) {
      masks.map[pb.params.mask.block_row_stride + j] = 0;
    }
  }
  check_hopper_forward(pb, masks, c.name);
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskHopperBlockMap,
                         ::testing::Combine(::testing::ValuesIn(hopper_block_map_cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// Every tile entry a build compiles, forced (SAMATTN_HOPPER_TILE) on problems of a few tiles.
// The library picks head dims 96 and 128's entry 0 only past 2k keys or with kv_stride, and head
// dim 64's entry 1 only for causal calls up to 512, so the other tests meet some entries with
// only some masks; head dim 96's entry 0 also has a softmax body of its own (one_softmax_copy).
// Each option that changes a key block's softmax or the blocks walked: causal, a window, a block
// map, kv_stride, tails of both sequences.
std::vector<TcMaskCase> hopper_every_tile_cases() {
  std::vector<TcMaskCase> c;
  for (int64_t d : {64, 96, 128}) {
    const std::string dim = "_d" + std::to_string(d);
    c.push_back({"causal" + dim, {1, 2, 2, 300, 300, d, d}, true});
    c.push_back({"tails" + dim, {2, 2, 1, 129, 77, d, d}});
    c.push_back({"window_causal" + dim, {1, 2, 2, 300, 300, d, d}, true, 1, 64, -1});
    c.push_back({"window" + dim, {1, 2, 1, 300, 260, d, d}, false, 1, 50, 30});
    c.push_back({"kv_stride2_causal" + dim, {1, 4, 2, 300, 600, d, d}, true, 2});
    TcMaskCase map{"map_causal" + dim, {1, 2, 2, 500, 500, d, d}, true};
    map.map_q = map.map_k = 128;
    c.push_back(map);
  }
  return c;
}

class MaskHopperEveryTile : public ::testing::TestWithParam<std::tuple<TcMaskCase, DType>> {};

TEST_P(MaskHopperEveryTile, ForwardMatchesReference) {
  SKIP_WITHOUT_HOPPER();
  const auto& [c, dtype] = GetParam();
  const int64_t d = c.shape.head_dim;
  int entries = 0;
  for (int variant = 0; variant < hopper::tile_variants(d); ++variant) {
    if (!hopper::tile_in_every_build(d, variant)) continue;
    SCOPED_TRACE(::testing::Message() << "SAMATTN_HOPPER_TILE=" << variant);
    const ScopedHopperTile tile(variant);
    Problem pb(c.shape, dtype, false, std::hash<std::string>{}(c.name) + variant);
    apply_options(c, pb.params);
    const HostMasks masks = make_masks(c, pb.params);
    check_hopper_forward(pb, masks, c.name);
    ++entries;
  }
  EXPECT_GE(entries, 2) << "head dim " << d << " has one entry in every build: nothing to force";
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskHopperEveryTile,
                         ::testing::Combine(::testing::ValuesIn(hopper_every_tile_cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// The list warp finds a tile's coordinates itself and builds its key-block masks while the
// producer finds them (ForwardKernelOptions::list_under_coords), and the tile's Q copy goes out
// before the producer waits for them (q_before_list, the consumers waiting for the masks on
// their own barrier). Asked once the producer has the coordinates ("list_after_coords"), or with
// the Q copy after the list ("q_after_list"), or with each tile's list and Q taken at the tile
// boundary rather than a tile ahead ("no_lookahead"), the kernel computes the same thing, so
// every block-map case writes the same bytes, every one of them (the output is poisoned with NaN
// before each run).
TEST(MaskHopperBlockMapRuns, ListOrderAblationsAreBitIdentical) {
  SKIP_WITHOUT_HOPPER();
  for (const TcMaskCase& c : hopper_block_map_cases()) {
    SCOPED_TRACE(c.name);
    Problem pb(c.shape, DType::kBFloat16, false, std::hash<std::string>{}(c.name));
    apply_options(c, pb.params);
    const HostMasks masks = make_masks(c, pb.params);
    DeviceRun dev(pb, masks, false);
    dev.params.backend = Backend::kHopper;
    auto run = [&]() {
      dev.out.upload(pb.out);
      attention_forward(dev.params, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      HostTensor got(pb.dtype, pb.out.size());
      dev.out.download(got.data());
      return got;
    };
    const HostTensor by_default = run();
    int64_t nans = 0;
    for (int64_t i = 0; i < by_default.size(); ++i) nans += std::isnan(by_default.get(i)) ? 1 : 0;
    EXPECT_EQ(nans, 0);
    for (const char* ablation : {"list_after_coords", "q_after_list", "no_lookahead"}) {
      SCOPED_TRACE(ablation);
      const ScopedHopperAblation scoped(ablation);
      EXPECT_EQ(by_default.bytes, run().bytes);
    }
  }
}

// The fixed pattern's decomposition on the Hopper forward (attention/fixed_pattern.h): the
// summary columns gathered and run as one staircase call with an fp32 output, the own blocks on
// the masked kernel merging it. Taken by the default dispatch when the workspace is given;
// without it the same call runs on the masked kernel alone. Pattern blocks longer and shorter
// than the kernels' tiles (so tiles span several, and 192-row head-dim-64 tiles cut them), GQA,
// (B, S, H, D) layouts, Sq > Sk (rows whose own block lies past the keys see only summary
// columns), Sq < Sk, c = l (every column a summary column) and l = 1, every head dim.
struct HopperFixedCase {
  std::string name;
  Shape shape;
  int64_t block, summary;
  bool seq_major = false;
};

std::vector<HopperFixedCase> hopper_fixed_cases() {
  return {
      {"l128_c16_d128", {1, 2, 2, 1000, 1000, 128, 128}, 128, 16},
      {"l64_c8_gqa_d64", {2, 8, 2, 777, 777, 64, 64}, 64, 8},
      {"l200_c24_seq_major_d64", {2, 2, 1, 900, 900, 64, 64}, 200, 24, true},
      {"sq_gt_sk_d128", {1, 2, 2, 600, 333, 128, 128}, 100, 10},
      {"sq_lt_sk_d64", {1, 2, 2, 300, 700, 64, 64}, 96, 32},
      {"full_summary_d256", {1, 2, 1, 400, 400, 256, 256}, 50, 50},
      {"l1_d128", {1, 1, 1, 130, 130, 128, 128}, 1, 1},
      {"l128_c16_d96", {1, 2, 2, 700, 700, 96, 96}, 128, 16},
      {"l100_c10_d192", {1, 2, 1, 400, 400, 192, 192}, 100, 10},
  };
}

void PrintTo(const HopperFixedCase& c, std::ostream* os) { *os << c.name; }

class MaskHopperFixed : public ::testing::TestWithParam<std::tuple<HopperFixedCase, DType>> {};

TEST_P(MaskHopperFixed, DecompositionMatchesReference) {
  SKIP_WITHOUT_HOPPER();
  const auto& [c, dtype] = GetParam();
  Problem pb(c.shape, dtype, c.seq_major, std::hash<std::string>{}(c.name));
  pb.params.mask.pattern = SparsePattern::kFixed;
  pb.params.mask.pattern_block = c.block;
  pb.params.mask.pattern_summary = c.summary;
  const HostTensor ref = pb.reference(/*with_lse=*/true);
  const HostTensor rounded = rounded_forward(pb);

  DeviceRun dev(pb, HostMasks{}, false);
  dev.params.backend = Backend::kAuto;
  ASSERT_TRUE(detail::fixed_decomposition_status(dev.params).ok())
      << detail::fixed_decomposition_status(dev.params).message();
  ASSERT_EQ(select_backend(dev.params), Backend::kHopper);
  const size_t bytes = attention_forward_workspace_bytes(dev.params);
  ASSERT_GT(bytes, 0u);
  DeviceBuffer workspace(bytes);
  ASSERT_EQ(cudaMemset(workspace.get(), 0xff, bytes), cudaSuccess);  // poisoned, as the outputs
  dev.params.workspace = workspace.get();
  run_forward_and_check(dev, pb, ref, rounded, c.name);

  // No workspace: the masked kernel alone, under the same bound (outputs poisoned again).
  dev.out.upload(pb.out);
  ASSERT_EQ(cudaMemset(dev.lse.get(), 0xff, pb.lse.size() * sizeof(float)), cudaSuccess);
  dev.params.workspace = nullptr;
  run_forward_and_check(dev, pb, ref, rounded, c.name + " without workspace");
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskHopperFixed,
                         ::testing::Combine(::testing::ValuesIn(hopper_fixed_cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// The decomposition declines what it cannot run, with the reason; those calls stay on the masked
// kernel.
TEST(MaskHopperDispatch, FixedPatternsTheDecompositionCannotRunStayOnTheMaskedKernel) {
  SKIP_WITHOUT_HOPPER();
  struct Declined {
    int64_t seqlen_q, kv_stride, window_left, head_dim;
    const char* reason;
  };
  for (const Declined& d :
       {Declined{300, 2, -1, 64, "kv_stride"}, Declined{300, 1, 90, 64, "window"},
        Declined{100, 1, -1, 64, "no summary part"}, Declined{300, 1, -1, 32, "head_dim 32"}}) {
    Problem pb({1, 2, 2, d.seqlen_q, 300, d.head_dim, d.head_dim}, DType::kBFloat16, false, 9);
    pb.params.kv_stride = d.kv_stride;
    pb.params.mask.window_left = d.window_left;
    pb.params.mask.pattern = SparsePattern::kFixed;
    pb.params.mask.pattern_block = 128;
    pb.params.mask.pattern_summary = 16;
    DeviceRun dev(pb, HostMasks{}, false);
    dev.params.backend = Backend::kAuto;
    EXPECT_EQ(select_backend(dev.params), Backend::kTensorCore) << d.reason;
    EXPECT_EQ(attention_forward_workspace_bytes(dev.params), 0u) << d.reason;
    const std::string why = detail::fixed_decomposition_status(dev.params).message();
    EXPECT_NE(why.find(d.reason), std::string::npos) << why;
  }
}

// Block maps the Hopper forward cannot walk stay on the tensor-core masked kernel, each with the
// reason: map rows that split a warpgroup's 64 rows, map columns that split a key block, an
// element mask on top.
TEST(MaskHopperDispatch, BlockMapsItCannotWalkStayOnTheMaskedKernel) {
  SKIP_WITHOUT_HOPPER();
  struct Unsupported {
    int64_t map_q, map_k;
    bool element;
    const char* reason;
  };
  for (const Unsupported& u :
       {Unsupported{48, 128, false, "block_q 48"}, Unsupported{128, 64, false, "block_k 64"},
        Unsupported{128, 128, true, "attn_mask"}}) {
    TcMaskCase c{"map", {1, 2, 2, 300, 300, 128, 128}};
    c.map_q = u.map_q;
    c.map_k = u.map_k;
    c.element = u.element ? ElementMask::kBool : ElementMask::kNone;
    Problem pb(c.shape, DType::kBFloat16, false, 5);
    const HostMasks masks = make_masks(c, pb.params);
    DeviceRun dev(pb, masks, false);
    dev.params.backend = Backend::kHopper;
    EXPECT_EQ(select_backend(dev.params), Backend::kTensorCore) << u.reason;
    const std::string why = hopper::supports(dev.params).message();
    EXPECT_NE(why.find(u.reason), std::string::npos) << why;
  }
}

// A window with kv_stride > 1 stays on the tensor-core masked kernel (the Hopper forward takes
// the window with kv_stride 1 only), even when the Hopper path is asked for.
TEST(MaskHopperDispatch, WindowWithKvStrideStaysOnTheMaskedKernel) {
  SKIP_WITHOUT_HOPPER();
  Problem pb({1, 2, 2, 200, 260, 128, 128}, DType::kBFloat16, false, 3);
  pb.params.kv_stride = 3;
  pb.params.mask.window_left = 90;
  DeviceRun dev(pb, HostMasks{}, false);
  dev.params.backend = Backend::kHopper;
  EXPECT_EQ(select_backend(dev.params), Backend::kTensorCore);
}

// Varlen on the Hopper forward: each packed sequence is a dense problem at an offset of the packed
// tensors, so the varlen call must write, sequence by sequence, the bytes of a dense batch-1
// Hopper call on that sequence's rows (checked against the reference by MaskHopper and the
// Hopper suites), lse included. Empty sequences, rows that see no key, sequences longer than a
// 128-row tile, GQA, every head dim, causal and the window; every output poisoned first. One
// block per unit and the static schedule (SAMATTN_HOPPER_ABLATION) must write the same bytes.
struct HopperVarlenCase {
  std::string name;
  std::vector<int32_t> lengths_q, lengths_k;
  int64_t head_dim;
  bool causal;
  int64_t window_left = -1, window_right = -1;
  bool lower_right = false;
};

std::vector<HopperVarlenCase> hopper_varlen_cases() {
  const std::vector<int32_t> mixed = {300, 0, 129, 1, 700, 64, 255};
  const std::vector<int32_t> other = {250, 40, 0, 1, 900, 64, 128};
  return {
      {"mixed_d64", mixed, mixed, 64, false},
      {"mixed_causal_d128", mixed, mixed, 128, true},
      {"cross_lengths_d128", mixed, other, 128, false},
      {"cross_lengths_causal_d256", mixed, other, 256, true},
      {"window_d128", mixed, mixed, 128, false, 90, 30},
      {"mixed_causal_d96", mixed, mixed, 96, true},
      {"cross_lengths_d192", mixed, other, 192, false},
      // Each sequence's own bottom-right diagonal (Sk > Sq, Sq > Sk, either empty).
      {"cross_lengths_lower_right_d128", mixed, other, 128, false, -1, -1, true},
      {"cross_lengths_lower_right_window_d64", other, mixed, 64, false, 70, -1, true},
  };
}

class MaskHopperVarlen : public ::testing::TestWithParam<std::tuple<HopperVarlenCase, DType>> {};

TEST_P(MaskHopperVarlen, EqualsOneDenseCallPerSequence) {
  SKIP_WITHOUT_HOPPER();
  const auto& [c, dtype] = GetParam();
  constexpr int64_t kHeadsQ = 4, kHeadsKv = 2;
  const int64_t d = c.head_dim, sequences = static_cast<int64_t>(c.lengths_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < sequences; ++b) {
    cu_q.push_back(cu_q.back() + c.lengths_q[b]);
    cu_k.push_back(cu_k.back() + c.lengths_k[b]);
  }
  const int64_t total_q = cu_q.back(), total_k = cu_k.back();
  HostTensor q(dtype, total_q * kHeadsQ * d), k(dtype, total_k * kHeadsKv * d),
      v(dtype, total_k * kHeadsKv * d), poisoned(dtype, total_q * kHeadsQ * d);
  fill_random(q, 1);
  fill_random(k, 2);
  fill_random(v, 3);
  poisoned.poison();
  DeviceBuffer dq(q), dk(k), dv(v), varlen_out(poisoned), dense_out(poisoned),
      d_cu_q(cu_q.size() * sizeof(int32_t)), d_cu_k(cu_k.size() * sizeof(int32_t)),
      varlen_lse(kHeadsQ * total_q * sizeof(float));
  ASSERT_EQ(
      cudaMemcpy(d_cu_q.get(), cu_q.data(), cu_q.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(d_cu_k.get(), cu_k.data(), cu_k.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(cudaMemset(varlen_lse.get(), 0xff, kHeadsQ * total_q * sizeof(float)), cudaSuccess);

  // Packed (total, heads, dim) rows; the dense calls use the same strides with batch 1.
  AttentionParams p;
  p.dtype = dtype;
  p.heads_q = kHeadsQ;
  p.heads_kv = kHeadsKv;
  p.head_dim = p.head_dim_v = d;
  p.q_strides = p.out_strides = Strides{0, d, kHeadsQ * d};
  p.k_strides = p.v_strides = Strides{0, d, kHeadsKv * d};
  p.causal = c.causal;
  p.mask.window_left = c.window_left;
  p.mask.window_right = c.window_right;
  p.mask.causal_lower_right = c.lower_right;
  p.backend = Backend::kHopper;
  auto element = [&](const DeviceBuffer& buffer, int64_t offset) {
    return static_cast<void*>(static_cast<char*>(buffer.get()) + offset * dtype_size(dtype));
  };

  AttentionParams packed = p;
  packed.batch = sequences;
  packed.seqlen_q = *std::max_element(c.lengths_q.begin(), c.lengths_q.end());
  packed.seqlen_k = *std::max_element(c.lengths_k.begin(), c.lengths_k.end());
  packed.q = dq.get();
  packed.k = dk.get();
  packed.v = dv.get();
  packed.out = varlen_out.get();
  packed.lse = varlen_lse.get();
  packed.mask.cu_seqlens_q = static_cast<const int32_t*>(d_cu_q.get());
  packed.mask.cu_seqlens_k = static_cast<const int32_t*>(d_cu_k.get());
  packed.mask.total_q = total_q;
  packed.mask.total_k = total_k;
  ASSERT_EQ(select_backend(packed), Backend::kHopper);
  packed.backend = Backend::kAuto;
  ASSERT_EQ(select_backend(packed), Backend::kHopper);
  attention_forward(packed, nullptr);
  // The schedule's other forms must write the same bytes: one block per unit, and the
  // persistent grid's static round robin (the default takes units from the work counter when
  // there are more than SMs: 168 units at head dim 128 without causal pairs).
  const char* other_schedules[] = {"varlen_block_per_unit", "static_schedule"};
  DeviceBuffer other_outs[] = {DeviceBuffer(poisoned), DeviceBuffer(poisoned)};
  for (size_t i = 0; i < std::size(other_schedules); ++i) {
    AttentionParams other = packed;
    other.out = other_outs[i].get();
    other.lse = nullptr;
    const ScopedHopperAblation schedule(other_schedules[i]);
    attention_forward(other, nullptr);
  }

  std::vector<std::vector<float>> dense_lse(sequences);
  for (int64_t b = 0; b < sequences; ++b) {
    if (c.lengths_q[b] == 0) continue;
    AttentionParams dense = p;
    dense.batch = 1;
    dense.seqlen_q = c.lengths_q[b];
    dense.seqlen_k = c.lengths_k[b];
    dense.q = element(dq, cu_q[b] * kHeadsQ * d);
    dense.k = element(dk, cu_k[b] * kHeadsKv * d);
    dense.v = element(dv, cu_k[b] * kHeadsKv * d);
    dense.out = element(dense_out, cu_q[b] * kHeadsQ * d);
    DeviceBuffer lse(kHeadsQ * c.lengths_q[b] * sizeof(float));
    dense.lse = lse.get();
    attention_forward(dense, nullptr);
    dense_lse[b].resize(kHeadsQ * c.lengths_q[b]);
    lse.download(dense_lse[b].data());  // synchronous: the buffer outlives the kernel
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(dtype, poisoned.size()), want(dtype, poisoned.size());
  varlen_out.download(got.data());
  dense_out.download(want.data());
  EXPECT_EQ(got.bytes, want.bytes);
  for (size_t i = 0; i < std::size(other_schedules); ++i) {
    other_outs[i].download(want.data());
    EXPECT_EQ(got.bytes, want.bytes) << other_schedules[i] << " wrote other bytes";
  }
  std::vector<float> lse(kHeadsQ * total_q);
  varlen_lse.download(lse.data());
  int64_t wrong = 0;
  for (int64_t b = 0; b < sequences; ++b) {
    for (int64_t h = 0; h < kHeadsQ; ++h) {
      for (int64_t i = 0; i < c.lengths_q[b]; ++i) {
        const float a = lse[h * total_q + cu_q[b] + i], e = dense_lse[b][h * c.lengths_q[b] + i];
        if (std::memcmp(&a, &e, sizeof(float)) != 0 && wrong++ == 0) {
          ADD_FAILURE() << "lse of sequence " << b << " head " << h << " row " << i << ": " << a
                        << ", dense call " << e;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, MaskHopperVarlen,
                         ::testing::Combine(::testing::ValuesIn(hopper_varlen_cases()),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         case_and_dtype_name);

// Varlen with kv_stride > 1 stays on the tensor-core masked kernel (a sequence may start at any
// row of the packed k, not only at kept positions).
TEST(MaskHopperDispatch, VarlenWithKvStrideStaysOnTheMaskedKernel) {
  SKIP_WITHOUT_HOPPER();
  AttentionParams p;
  p.dtype = DType::kBFloat16;
  p.batch = 2;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = p.seqlen_k = 64;
  p.head_dim = p.head_dim_v = 128;
  p.q_strides = p.k_strides = p.v_strides = p.out_strides = Strides{0, 128, 256};
  p.kv_stride = 2;
  DeviceBuffer q(128 * 256 * 2), cu(3 * sizeof(int32_t));
  const int32_t offsets[] = {0, 64, 128};
  ASSERT_EQ(cudaMemcpy(cu.get(), offsets, sizeof(offsets), cudaMemcpyHostToDevice), cudaSuccess);
  p.q = p.k = p.v = q.get();
  p.out = q.get();
  p.mask.cu_seqlens_q = p.mask.cu_seqlens_k = static_cast<const int32_t*>(cu.get());
  p.mask.total_q = p.mask.total_k = 128;
  p.backend = Backend::kHopper;
  EXPECT_EQ(select_backend(p), Backend::kTensorCore);
}

}  // namespace
}  // namespace samattn::testing
