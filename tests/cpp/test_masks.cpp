// Masks (samattn/mask.h): the policy's block classification against element-wise visibility
// (exhaustive on small rectangles), the fixed pattern's decomposition as a partition, validation of
// every mask field, the reference's varlen checks, and (with a GPU) the SIMT kernels with
// attn_mask, window, patterns and varlen against the fp64 reference for every dtype, forward and
// backward, outputs poisoned.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/fixed_pattern.h"
#include "attention/mask_policy.h"
#include "attention/strided_pattern.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

using detail::BlockClass;
using detail::MaskPolicy;

std::vector<MaskPolicy> policies() {
  std::vector<MaskPolicy> out;
  for (bool causal : {false, true}) {
    for (int64_t left : {-1, 0, 3, 9}) {
      for (int64_t right : {-1, 0, 2}) {
        out.push_back({causal, left, right, SparsePattern::kNone, 0, 0});
      }
    }
  }
  // Bottom-right causal: the diagonal shifted by seqlen_k - seqlen_q, either way; the window
  // centred on j = i, or following the shifted diagonal (window_follows_causal).
  for (int64_t shift : {-7, -1, 3, 12}) {
    for (int64_t left : {-1, 0, 9}) {
      for (int64_t right : {-1, 2}) {
        for (bool follows : {false, true}) {
          out.push_back({true, left, right, SparsePattern::kNone, 0, 0, shift, true, follows});
        }
      }
    }
  }
  for (int64_t l : {1, 3, 4, 8}) {
    out.push_back({false, -1, -1, SparsePattern::kStrided, l, 0});
    out.push_back({true, 5, -1, SparsePattern::kStrided, l, 0});
    for (int64_t c = 1; c <= l; c += 2) out.push_back({false, -1, -1, SparsePattern::kFixed, l, c});
    // No summary columns: the fixed pattern's own blocks, the local part of its decomposition.
    out.push_back({false, -1, -1, SparsePattern::kFixed, l, 0});
  }
  return out;
}

// Bottom-right causal from the definition: query i of a sequence of seqlen_q queries sees key
// j <= i + seqlen_k - seqlen_q, whatever the call's maximum lengths (the shift is the sequence's).
TEST(MaskPolicy, LowerRightCausalFollowsEachSequencesLengths) {
  MaskOptions options;
  options.causal_lower_right = true;
  const MaskPolicy call = detail::make_mask_policy(false, options);
  EXPECT_TRUE(call.causal);
  EXPECT_TRUE(call.lower_right);
  for (auto [seqlen_q, seqlen_k] :
       {std::pair<int64_t, int64_t>{5, 5}, {3, 11}, {11, 3}, {1, 9}, {9, 1}, {4, 0}}) {
    const MaskPolicy p = detail::for_sequence(call, seqlen_q, seqlen_k);
    for (int64_t i = 0; i < seqlen_q; ++i) {
      for (int64_t j = 0; j < seqlen_k; ++j) {
        EXPECT_EQ(detail::structurally_visible(p, i, j), j <= i + seqlen_k - seqlen_q)
            << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k << " query " << i << " key "
            << j;
      }
    }
  }
  // With window_follows_causal the window moves with the diagonal (FlashAttention's
  // window_size): query i sees i + shift - left <= j <= i + shift + right, and j <= i + shift.
  options.window_left = 2;
  options.window_right = 1;
  options.window_follows_causal = true;
  for (auto [seqlen_q, seqlen_k] : {std::pair<int64_t, int64_t>{3, 11}, {11, 3}, {6, 6}}) {
    const MaskPolicy p =
        detail::for_sequence(detail::make_mask_policy(false, options), seqlen_q, seqlen_k);
    const int64_t shift = seqlen_k - seqlen_q;
    for (int64_t i = 0; i < seqlen_q; ++i) {
      for (int64_t j = 0; j < seqlen_k; ++j) {
        EXPECT_EQ(detail::structurally_visible(p, i, j), j >= i + shift - 2 && j <= i + shift)
            << "seqlen_q " << seqlen_q << " seqlen_k " << seqlen_k << " query " << i << " key "
            << j;
      }
    }
  }
  // Top-left causal keeps its diagonal whatever the lengths.
  const MaskPolicy top_left = detail::for_sequence(detail::make_mask_policy(true, {}), 3, 11);
  EXPECT_FALSE(detail::structurally_visible(top_left, 0, 1));
  EXPECT_TRUE(detail::structurally_visible(top_left, 2, 2));
}

// The reference with mask.causal_lower_right equals the reference fed the definition as a
// boolean mask (j <= i + Sk - Sq, with kv_stride), forward (out, lse) and backward, exactly: both
// sum the same visible keys in the same order.
TEST(MaskReference, LowerRightCausalEqualsItsBooleanMask) {
  for (auto [shape, kv_stride] : {std::pair<Shape, int64_t>{{1, 2, 1, 5, 9, 4, 3}, 1},
                                  {{2, 2, 2, 9, 4, 4, 4}, 1},
                                  {{1, 1, 1, 6, 13, 3, 3}, 2}}) {
    std::vector<uint8_t> definition(shape.seqlen_q * shape.seqlen_k);
    for (int64_t i = 0; i < shape.seqlen_q; ++i)
      for (int64_t j = 0; j < shape.seqlen_k; ++j)
        definition[i * shape.seqlen_k + j] = j <= i + shape.seqlen_k - shape.seqlen_q;
    Problem flag(shape, DType::kFloat64, false, 7), mask(shape, DType::kFloat64, false, 7);
    flag.params.kv_stride = mask.params.kv_stride = kv_stride;
    flag.params.mask.causal_lower_right = true;
    mask.params.mask.data = definition.data();
    mask.params.mask.row_stride = shape.seqlen_k;
    mask.params.mask.col_stride = 1;
    const HostTensor got = flag.reference(/*with_lse=*/true);
    const HostTensor want = mask.reference(/*with_lse=*/true);
    const std::string where = "Sq " + std::to_string(shape.seqlen_q) + " Sk " +
                              std::to_string(shape.seqlen_k) + " kv_stride " +
                              std::to_string(kv_stride);
    EXPECT_EQ(got.bytes, want.bytes) << where;
    ASSERT_EQ(flag.lse.size(), mask.lse.size());
    for (size_t r = 0; r < flag.lse.size(); ++r) {
      EXPECT_TRUE(flag.lse[r] == mask.lse[r] || (std::isinf(flag.lse[r]) && flag.lse[r] < 0 &&
                                                 std::isinf(mask.lse[r]) && mask.lse[r] < 0))
          << where << " lse row " << r << ": " << flag.lse[r] << " vs " << mask.lse[r];
    }
    // The first Sq - Sk rows (when positive) see no key.
    EXPECT_EQ(
        std::count_if(flag.lse.begin(), flag.lse.end(), [](double x) { return std::isinf(x); }),
        std::max<int64_t>(0, shape.seqlen_q - shape.seqlen_k) * shape.batch * shape.heads_q)
        << where;
    HostTensor dout(DType::kFloat64, flag.out.size());
    fill_random(dout, 11);
    std::vector<HostTensor> grads;
    for (Problem* pb : {&flag, &mask}) {
      HostTensor dq(DType::kFloat64, pb->q.size()), dk(DType::kFloat64, pb->k.size()),
          dv(DType::kFloat64, pb->v.size());
      AttentionBackwardParams bp;
      bp.forward = pb->params;
      bp.forward.out = const_cast<void*>(got.data());
      bp.dout = dout.data();
      bp.dout_strides = pb->params.out_strides;
      bp.dq_strides = pb->params.q_strides;
      bp.dk_strides = pb->params.k_strides;
      bp.dv_strides = pb->params.v_strides;
      bp.dq = dq.data();
      bp.dk = dk.data();
      bp.dv = dv.data();
      reference_attention_backward(bp);
      grads.push_back(dq);
      grads.push_back(dk);
      grads.push_back(dv);
    }
    for (int g = 0; g < 3; ++g)
      EXPECT_EQ(grads[g].bytes, grads[g + 3].bytes) << where << " grad " << g;
  }
}

// mask.window_follows_causal in the reference equals its definition as a boolean mask
// (FlashAttention's window_size: i + shift - left <= j <= i + shift + right, j <= i + shift), the
// shift each batch entry's own with cache_seqlens; the output exactly (the same keys, in order).
TEST(MaskReference, WindowFollowingBottomRightCausalEqualsItsBooleanMask) {
  const Shape shape{3, 2, 1, 5, 12, 4, 4};
  const std::vector<int32_t> lengths = {12, 7, 3};
  for (const bool per_entry : {false, true}) {
    for (auto [left, right] : {std::pair<int64_t, int64_t>{3, -1}, {0, 0}, {2, 1}, {-1, 2}}) {
      std::vector<uint8_t> definition(shape.batch * shape.seqlen_q * shape.seqlen_k);
      for (int64_t b = 0; b < shape.batch; ++b) {
        const int64_t keys = per_entry ? lengths[b] : shape.seqlen_k;
        const int64_t shift = keys - shape.seqlen_q;
        for (int64_t i = 0; i < shape.seqlen_q; ++i) {
          for (int64_t j = 0; j < shape.seqlen_k; ++j) {
            definition[(b * shape.seqlen_q + i) * shape.seqlen_k + j] =
                j < keys && j <= i + shift && (left < 0 || j >= i + shift - left) &&
                (right < 0 || j <= i + shift + right);
          }
        }
      }
      Problem flag(shape, DType::kFloat64, false, 9), mask(shape, DType::kFloat64, false, 9);
      flag.params.mask.causal_lower_right = true;
      flag.params.mask.window_follows_causal = true;
      flag.params.mask.window_left = left;
      flag.params.mask.window_right = right;
      if (per_entry) flag.params.mask.cache_seqlens = lengths.data();
      mask.params.mask.data = definition.data();
      mask.params.mask.batch_stride = shape.seqlen_q * shape.seqlen_k;
      mask.params.mask.row_stride = shape.seqlen_k;
      mask.params.mask.col_stride = 1;
      const HostTensor got = flag.reference(/*with_lse=*/true);
      const HostTensor want = mask.reference(/*with_lse=*/true);
      EXPECT_EQ(got.bytes, want.bytes)
          << "window (" << left << ", " << right << ")" << (per_entry ? " cache_seqlens" : "");
    }
  }
  Problem lone({1, 1, 1, 2, 4, 4, 4}, DType::kFloat64);
  lone.params.mask.window_follows_causal = true;
  EXPECT_NE(can_implement(lone.params).message().find("needs mask.causal_lower_right"),
            std::string::npos);
}

// kSkip must mean no pair is visible and kFull that all are; kPartial is always allowed, but
// causal and the window alone must be classified exactly.
TEST(MaskPolicy, BlockClassificationAgreesWithElements) {
  for (const MaskPolicy& p : policies()) {
    for (int64_t q0 = 0; q0 < 20; q0 += 3) {
      for (int64_t k0 = 0; k0 < 20; k0 += 2) {
        for (int64_t rows : {1, 4, 7}) {
          for (int64_t keys : {1, 3, 8}) {
            int visible = 0;
            for (int64_t i = q0; i < q0 + rows; ++i)
              for (int64_t j = k0; j < k0 + keys; ++j)
                visible += detail::structurally_visible(p, i, j) ? 1 : 0;
            const BlockClass got = detail::classify_block(p, q0, q0 + rows, k0, k0 + keys);
            const std::string where =
                "policy causal=" + std::to_string(p.causal) +
                " shift=" + std::to_string(p.causal_shift) + " window=(" +
                std::to_string(p.window_left) + "," + std::to_string(p.window_right) +
                ") pattern=" + sparse_pattern_name(p.pattern) + " l=" + std::to_string(p.block) +
                " c=" + std::to_string(p.summary) + " block q[" + std::to_string(q0) + "+" +
                std::to_string(rows) + ") k[" + std::to_string(k0) + "+" + std::to_string(keys) +
                ")";
            if (got == BlockClass::kSkip) EXPECT_EQ(visible, 0) << where;
            if (got == BlockClass::kFull) EXPECT_EQ(visible, rows * keys) << where;
            if (p.pattern == SparsePattern::kNone) {
              const BlockClass exact = visible == 0             ? BlockClass::kSkip
                                       : visible == rows * keys ? BlockClass::kFull
                                                                : BlockClass::kPartial;
              EXPECT_EQ(static_cast<int>(got), static_cast<int>(exact)) << where;
            }
          }
        }
      }
    }
  }
}

// The decomposition's local part (the fixed pattern with no summary columns) skips every key
// block that lies wholly below the query block's first pattern block: that is where its cost
// stays at a few blocks per row block.
TEST(MaskPolicy, FixedPatternWithoutSummaryColumnsSkipsEarlierPatternBlocks) {
  for (int64_t l : {1, 3, 4, 8}) {
    const MaskPolicy p{false, -1, -1, SparsePattern::kFixed, l, 0};
    for (int64_t q0 = 0; q0 < 40; q0 += 3) {
      const int64_t own_start = q0 / l * l;
      for (int64_t k0 = 0; k0 < own_start; ++k0) {
        for (int64_t keys = 1; k0 + keys <= own_start; ++keys) {
          EXPECT_EQ(static_cast<int>(detail::classify_block(p, q0, q0 + 5, k0, k0 + keys)),
                    static_cast<int>(BlockClass::kSkip))
              << "l " << l << " queries from " << q0 << " keys [" << k0 << ", " << k0 + keys << ")";
        }
      }
    }
  }
}

// The fixed pattern's decomposition (attention/fixed_pattern.h) covers exactly the pattern, with
// its two parts disjoint: for every query, the own-block keys (the pattern with c = 0) and the
// gathered summary keys below floor(i / l) * c (and below fixed_summary_keys) mapped back to key
// rows by summary_key_row, against the fixed pattern's keys below seqlen_k. Lengths with partial
// last pattern blocks, Sq > Sk (own blocks past the keys), Sq < Sk, c = l and l = 1.
TEST(FixedPatternDecomposition, PartsPartitionThePattern) {
  struct Case {
    int64_t seqlen_q, seqlen_k, l, c;
  };
  for (const Case& t : {Case{1000, 1000, 128, 16}, Case{777, 777, 64, 8}, Case{600, 333, 100, 10},
                        Case{300, 700, 96, 32}, Case{400, 400, 50, 50}, Case{130, 130, 1, 1},
                        Case{129, 129, 128, 1}, Case{200, 117, 16, 15}, Case{50, 300, 7, 3}}) {
    AttentionParams params;
    params.seqlen_q = t.seqlen_q;
    params.seqlen_k = t.seqlen_k;
    params.mask.pattern = SparsePattern::kFixed;
    params.mask.pattern_block = t.l;
    params.mask.pattern_summary = t.c;
    const int64_t gathered = detail::fixed_summary_keys(params);
    const MaskPolicy pattern{false, -1, -1, SparsePattern::kFixed, t.l, t.c};
    const MaskPolicy local{false, -1, -1, SparsePattern::kFixed, t.l, 0};
    const std::string where = "Sq " + std::to_string(t.seqlen_q) + " Sk " +
                              std::to_string(t.seqlen_k) + " l " + std::to_string(t.l) + " c " +
                              std::to_string(t.c);
    // Exactly the summary columns some query sees (before the last query's pattern block).
    int64_t seen = 0;
    for (int64_t j = 0; j < t.seqlen_k; ++j) {
      seen += j % t.l >= t.l - t.c && j / t.l < (t.seqlen_q - 1) / t.l;
    }
    EXPECT_EQ(gathered, seen) << where;
    for (int64_t s = 0; s < gathered; ++s) {
      ASSERT_LT(detail::summary_key_row(s, t.l, t.c), t.seqlen_k) << where << " summary key " << s;
    }
    for (int64_t i = 0; i < t.seqlen_q; ++i) {
      std::vector<int> covered(t.seqlen_k, 0);
      for (int64_t j = 0; j < t.seqlen_k; ++j)
        covered[j] += detail::structurally_visible(local, i, j);
      for (int64_t s = 0; s < std::min(i / t.l * t.c, gathered); ++s) {
        ++covered[detail::summary_key_row(s, t.l, t.c)];
      }
      for (int64_t j = 0; j < t.seqlen_k; ++j) {
        ASSERT_EQ(covered[j], detail::structurally_visible(pattern, i, j) ? 1 : 0)
            << where << " query " << i << " key " << j;
      }
    }
  }
}

// The key range from causal and the window contains every visible key.
TEST(MaskPolicy, KeyRangeContainsEveryVisibleKey) {
  for (const MaskPolicy& p : policies()) {
    for (int64_t q0 = 0; q0 < 44; q0 += 5) {
      const detail::KeyRange range = detail::visible_key_range(p, q0, q0 + 6, 30);
      EXPECT_LE(range.begin, range.end);
      EXPECT_LE(range.end, 30) << "queries from " << q0;
      for (int64_t i = q0; i < q0 + 6; ++i) {
        for (int64_t j = 0; j < 30; ++j) {
          if (detail::structurally_visible(p, i, j)) {
            EXPECT_TRUE(j >= range.begin && j < range.end) << "query " << i << " key " << j;
          }
        }
      }
    }
  }
}

// The per-row key span and per-key query span are exactly the structurally visible pairs of
// causal and the window (patterns only thin them out), for every kv_stride, and never reach past
// the keys or the queries: with seqlen_q > seqlen_k a window can start past the last key (and with
// seqlen_k > seqlen_q a key can be first seen past the last query); the kernels load every key
// (query) below a block's span end.
TEST(MaskPolicy, SpansMatchElementVisibility) {
  for (const MaskPolicy& p : policies()) {
    for (auto [stride, seqlen_q, seqlen_k] : {std::tuple<int64_t, int64_t, int64_t>{1, 23, 29},
                                              {2, 23, 29},
                                              {3, 23, 29},
                                              {1, 40, 11},
                                              {2, 40, 11},
                                              {1, 9, 40},
                                              {3, 9, 40}}) {
      MaskPolicy band = p;
      band.pattern = SparsePattern::kNone;
      band.causal = p.causal || p.pattern != SparsePattern::kNone;
      const int64_t kept = (seqlen_k + stride - 1) / stride;
      for (int64_t i = 0; i < seqlen_q; ++i) {
        const detail::Span keys = detail::visible_key_span(p, i, kept, stride);
        for (int64_t n = 0; n < kept; ++n) {
          const bool visible = detail::structurally_visible(band, i, n * stride);
          EXPECT_EQ(visible, n >= keys.begin && n < keys.end)
              << "query " << i << " key " << n << " stride " << stride << " causal " << p.causal
              << " shift " << p.causal_shift << " window (" << p.window_left << ", "
              << p.window_right << ")";
        }
        EXPECT_LE(keys.begin, keys.end);
        EXPECT_LE(keys.end, kept) << "query " << i << " stride " << stride;
      }
      for (int64_t n = 0; n < kept; ++n) {
        const detail::Span queries = detail::visible_query_span(p, n, seqlen_q, stride);
        for (int64_t i = 0; i < seqlen_q; ++i) {
          EXPECT_EQ(detail::structurally_visible(band, i, n * stride),
                    i >= queries.begin && i < queries.end)
              << "key " << n << " query " << i << " stride " << stride;
        }
        EXPECT_LE(queries.begin, queries.end);
        EXPECT_LE(queries.end, seqlen_q) << "key " << n << " stride " << stride;
      }
    }
  }
}

// The strided pattern's residue views cover exactly the pairs with i - j a positive multiple of l
// (and within the window), each once, and the band covers the rest of the pattern.
TEST(StridedDecomposition, ResidueViewsAndBandPartitionThePattern) {
  for (int64_t l : {1, 3, 4, 7, 128}) {
    for (auto [seqlen_q, seqlen_k] : {std::pair<int64_t, int64_t>{1, 1},
                                      {30, 30},
                                      {77, 77},
                                      {129, 129},
                                      {40, 17},
                                      {17, 40},
                                      {300, 300}}) {
      for (int64_t window : {int64_t{-1}, int64_t{10}, int64_t{2 * l}}) {
        std::vector<int> covered(seqlen_q * seqlen_k, 0);
        for (const detail::ResidueGroup& g :
             detail::residue_groups(seqlen_q, seqlen_k, l, window)) {
          const int64_t view_window = window < 0 ? -1 : window / l - 1;
          for (int64_t r = g.first_residue; r < g.first_residue + g.count; ++r) {
            for (int64_t a = 0; a < g.rows; ++a) {
              for (int64_t c = 0; c <= a && c < g.keys; ++c) {
                if (view_window >= 0 && a - c > view_window) continue;
                const int64_t i = r + l * (a + 1), j = r + l * c;
                ASSERT_LT(i, seqlen_q);
                ASSERT_LT(j, seqlen_k);
                ++covered[i * seqlen_k + j];
              }
            }
          }
        }
        const MaskPolicy pattern{true, window, -1, SparsePattern::kStrided, l, 0};
        for (int64_t i = 0; i < seqlen_q; ++i) {
          for (int64_t j = 0; j < seqlen_k; ++j) {
            const bool band = j <= i && i - j <= l - 1 && (window < 0 || i - j <= window);
            const bool want = detail::structurally_visible(pattern, i, j);
            EXPECT_EQ(covered[i * seqlen_k + j] + (band ? 1 : 0), want ? 1 : 0)
                << "l " << l << " Sq " << seqlen_q << " Sk " << seqlen_k << " window " << window
                << " pair (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

Problem small_problem(DType dtype = DType::kFloat32) {
  return Problem(Shape{1, 2, 2, 5, 6, 4, 4}, dtype);
}

void expect_failure(const AttentionParams& p, const std::string& needle) {
  const Status status = can_implement(p);
  ASSERT_FALSE(status.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(std::string(status.message()).find(needle), std::string::npos) << status.message();
}

TEST(MaskValidation, NamedErrors) {
  Problem pb = small_problem();
  std::vector<uint8_t> mask(30, 1);
  AttentionParams p = pb.params;
  p.mask.data = mask.data();
  p.mask.dtype = MaskDType::kFloat16;
  expect_failure(p, "attn_mask dtype must be bool, float32 or the inputs' dtype (float32)");
  p.mask.dtype = static_cast<MaskDType>(42);
  expect_failure(p, "attn_mask dtype 42");
  p = pb.params;
  p.mask.window_left = -2;
  expect_failure(p, "window_left must be >= 0 or -1");
  p = pb.params;
  p.mask.window_right = -7;
  expect_failure(p, "window_right must be >= 0 or -1");
  p = pb.params;
  p.mask.pattern = SparsePattern::kStrided;
  expect_failure(p, "'strided' needs block (l) >= 1");
  p.mask.pattern = SparsePattern::kFixed;
  p.mask.pattern_block = 4;
  p.mask.pattern_summary = 0;
  expect_failure(p, "'fixed' needs summary (c) in [1, block = 4]");
  p.mask.pattern = static_cast<SparsePattern>(9);
  expect_failure(p, "sparse pattern 9");
  p = pb.params;
  p.mask.causal_lower_right = true;
  p.causal = true;
  expect_failure(p, "causal (top-left) and mask.causal_lower_right (bottom-right) are both set");
  p.causal = false;
  p.mask.pattern = SparsePattern::kStrided;
  p.mask.pattern_block = 2;
  expect_failure(p, "mask.causal_lower_right with sparse pattern strided");
  p = pb.params;
  const int32_t cu[] = {0, 5};
  p.mask.cu_seqlens_q = cu;
  expect_failure(p, "cu_seqlens_q and cu_seqlens_k must be given together");
  p.mask.cu_seqlens_k = cu;
  p.mask.total_q = p.mask.total_k = 5;
  expect_failure(p, "batch strides must be 0");
}

TEST(MaskValidation, ReferenceChecksHostCuSeqlens) {
  Problem pb(Shape{1, 1, 1, 4, 4, 3, 3}, DType::kFloat64);
  AttentionParams p = pb.params;
  p.batch = 2;
  p.q_strides.batch = p.k_strides.batch = p.v_strides.batch = p.out_strides.batch = 0;
  const int32_t decreasing[] = {0, 3, 2};
  const int32_t good[] = {0, 2, 4};
  p.mask.cu_seqlens_q = decreasing;
  p.mask.cu_seqlens_k = good;
  p.mask.total_q = 2;
  p.mask.total_k = 4;
  EXPECT_THROW(
      {
        try {
          reference_attention_forward(p);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("cu_seqlens_q must be non-decreasing"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  const int32_t wrong_total[] = {0, 2, 3};
  p.mask.cu_seqlens_q = good;
  p.mask.total_q = 4;
  p.mask.cu_seqlens_k = wrong_total;
  EXPECT_THROW(reference_attention_forward(p), Error);
}

// ---------------------------------------------------------------------------------------------
// GPU: the kernels against the reference.

struct MaskCase {
  std::string name;
  Shape shape;
  bool causal;
  int64_t window_left, window_right;
  SparsePattern pattern;
  int64_t block, summary;
  bool element_mask;
  bool lower_right = false;  // mask.causal_lower_right
};

const MaskCase kMaskCases[] = {
    {"window", {2, 2, 1, 150, 170, 64, 64}, false, 20, 5, SparsePattern::kNone, 0, 0, false},
    {"window_causal", {1, 2, 2, 300, 300, 32, 32}, true, 64, -1, SparsePattern::kNone, 0, 0, false},
    // Rows 117-128 see no key: output 0, lse -inf, no gradient.
    {"window_sq_gt_sk",
     {1, 2, 2, 129, 77, 96, 96},
     true,
     40,
     -1,
     SparsePattern::kNone,
     0,
     0,
     false},
    // Keys 75-199 are seen by no query: dK = dV = 0 there.
    {"window_sk_gt_sq",
     {1, 2, 2, 70, 200, 64, 64},
     false,
     10,
     5,
     SparsePattern::kNone,
     0,
     0,
     false},
    {"strided", {1, 2, 2, 260, 260, 64, 64}, false, -1, -1, SparsePattern::kStrided, 32, 0, false},
    {"fixed", {1, 2, 2, 260, 260, 128, 128}, false, -1, -1, SparsePattern::kFixed, 64, 8, false},
    {"bool_mask", {2, 2, 2, 77, 129, 40, 40}, false, -1, -1, SparsePattern::kNone, 0, 0, true},
    // Bottom-right causal both ways (with Sq > Sk the first 39 rows see no key).
    {"lower_right_sk_gt_sq",
     {2, 2, 1, 70, 130, 64, 64},
     false,
     -1,
     -1,
     SparsePattern::kNone,
     0,
     0,
     false,
     true},
    {"lower_right_sq_gt_sk_window_mask",
     {1, 2, 2, 129, 90, 32, 32},
     false,
     25,
     -1,
     SparsePattern::kNone,
     0,
     0,
     true,
     true},
    {"bool_mask_causal_window",
     {1, 4, 2, 100, 100, 96, 96},
     true,
     30,
     -1,
     SparsePattern::kNone,
     0,
     0,
     true},
};

// gtest prints a failing parameter with this (not as raw bytes).
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

// A bool mask (B, 1, Sq, Sk) broadcast over heads (head stride 0), ~30% hidden, row 3 all hidden.
std::vector<uint8_t> random_bool_mask(const Shape& s, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<uint8_t> mask(s.batch * s.seqlen_q * s.seqlen_k);
  for (auto& m : mask) m = (engine() % 10) >= 3;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.seqlen_k; ++j) mask[(b * s.seqlen_q + 3) * s.seqlen_k + j] = 0;
  return mask;
}

void apply(const MaskCase& c, AttentionParams& p, const void* mask) {
  p.causal = c.causal;
  p.mask.window_left = c.window_left;
  p.mask.window_right = c.window_right;
  p.mask.pattern = c.pattern;
  p.mask.pattern_block = c.block;
  p.mask.pattern_summary = c.summary;
  p.mask.causal_lower_right = c.lower_right;
  if (c.element_mask) {
    p.mask.data = mask;
    p.mask.dtype = MaskDType::kBool;
    p.mask.batch_stride = c.shape.seqlen_q * c.shape.seqlen_k;
    p.mask.head_stride = 0;
    p.mask.row_stride = c.shape.seqlen_k;
    p.mask.col_stride = 1;
  }
}

class MaskGpu : public ::testing::TestWithParam<std::tuple<MaskCase, DType>> {};

TEST_P(MaskGpu, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_GPU();
  const auto& [c, dtype] = GetParam();
  Problem pb(c.shape, dtype, false, std::hash<std::string>{}(c.name));
  const std::vector<uint8_t> mask = random_bool_mask(c.shape, 5);
  apply(c, pb.params, mask.data());
  const HostTensor ref = pb.reference(/*with_lse=*/true);

  DeviceProblem dp(pb);
  DeviceBuffer d_mask(mask.size());
  if (!mask.empty()) {
    ASSERT_EQ(cudaMemcpy(d_mask.get(), mask.data(), mask.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  const int64_t rows = c.shape.batch * c.shape.heads_q * c.shape.seqlen_q;
  const size_t lse_bytes = rows * (dtype == DType::kFloat64 ? 8 : 4);
  DeviceBuffer lse(lse_bytes);
  AttentionParams p = dp.pb.params;
  p.lse = lse.get();
  p.backend =
      Backend::kSimt;  // this suite checks the SIMT kernels (tensor cores: test_masks_tensor_core)
  if (c.element_mask) p.mask.data = d_mask.get();
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor got(dtype, pb.out.size());
  dp.out.download(got.data());
  EXPECT_TRUE(all_close(got, ref, dtype)) << c.name;
  std::vector<unsigned char> lse_host(lse_bytes);
  lse.download(lse_host.data());
  for (int64_t r = 0; r < rows; ++r) {
    const double value = dtype == DType::kFloat64
                             ? reinterpret_cast<const double*>(lse_host.data())[r]
                             : reinterpret_cast<const float*>(lse_host.data())[r];
    const double want = pb.lse[r];
    if (std::isinf(want)) {
      EXPECT_TRUE(std::isinf(value) && value < 0) << "row " << r << " got " << value;
    } else {
      EXPECT_NEAR(value, want, 1e-4 * (1 + std::fabs(want))) << "row " << r;
    }
  }

  // Backward: the reference backward on the host vs the SIMT kernels, gradients poisoned.
  HostTensor dout(dtype, pb.out.size()), dq(dtype, pb.q.size()), dk(dtype, pb.k.size()),
      dv(dtype, pb.v.size());
  fill_random(dout, 99);
  AttentionBackwardParams hb;
  hb.forward = pb.params;
  hb.forward.out = const_cast<void*>(ref.data());
  hb.forward.lse = nullptr;
  hb.dout = dout.data();
  hb.dout_strides = pb.params.out_strides;
  hb.dq_strides = pb.params.q_strides;
  hb.dk_strides = pb.params.k_strides;
  hb.dv_strides = pb.params.v_strides;
  hb.dq = dq.data();
  hb.dk = dk.data();
  hb.dv = dv.data();
  reference_attention_backward(hb);

  DeviceBuffer d_out(ref), d_dout(dout), d_dq(dq.bytes.size()), d_dk(dk.bytes.size()),
      d_dv(dv.bytes.size());
  HostTensor poison_q(dtype, pb.q.size()), poison_k(dtype, pb.k.size()),
      poison_v(dtype, pb.v.size());
  poison_q.poison();
  poison_k.poison();
  poison_v.poison();
  d_dq.upload(poison_q);
  d_dk.upload(poison_k);
  d_dv.upload(poison_v);
  AttentionBackwardParams db = hb;
  db.forward = p;
  db.forward.out = d_out.get();
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
  EXPECT_TRUE(all_close(gq, dq, dtype, 1.0)) << "dq " << c.name;
  EXPECT_TRUE(all_close(gk, dk, dtype, 1.0)) << "dk " << c.name;
  EXPECT_TRUE(all_close(gv, dv, dtype, 1.0)) << "dv " << c.name;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, MaskGpu,
                         ::testing::Combine(::testing::ValuesIn(kMaskCases),
                                            ::testing::Values(DType::kFloat64, DType::kFloat32,
                                                              DType::kFloat16, DType::kBFloat16)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace samattn::testing
