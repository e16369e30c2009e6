// Per-entry key lengths (MaskOptions::cache_seqlens) on the host: the fp64 reference against the
// same call written as an element mask, the per-entry decomposition (attention/cache_seqlens.h)
// against the whole call, a paged cache (MaskOptions::block_table) against the dense one, and
// the checks. The GPU runs are in test_masks_tensor_core.cpp
// (MaskTensorCore cache_lengths_*: one call per entry, forward and backward) and
// test_tensor_core_gpu.cpp (DecodeKernelGpu.CacheLengthsMatchReference, CacheSeqlensGpu).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/cache_seqlens.h"
#include "attention/decode.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

struct LengthsCase {
  const char* name;
  Shape shape;
  bool causal, lower_right;
  int64_t window_left, kv_stride;
  std::vector<int32_t> lengths;
};

const LengthsCase kCases[] = {
    {"dense_gqa", {4, 4, 2, 5, 40, 8, 8}, false, false, -1, 1, {40, 17, 0, 1}},
    {"causal", {3, 2, 2, 30, 40, 8, 6}, true, false, -1, 1, {40, 12, 31}},
    {"lower_right_fewer_keys_than_queries", {3, 2, 1, 9, 40, 8, 8}, false, true, -1, 1, {40, 4, 0}},
    {"lower_right_window_kv_stride2", {2, 2, 2, 7, 33, 4, 4}, false, true, 5, 2, {33, 20}},
};

// A (B, H, Sq, Sk) boolean mask hiding exactly what cache_seqlens hides: keys past the entry's
// length and, with bottom-right causal, keys past each query's own diagonal j <= i + L - Sq.
std::vector<uint8_t> equivalent_mask(const AttentionParams& p, const std::vector<int32_t>& lengths,
                                     bool lower_right) {
  std::vector<uint8_t> keep(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          const bool kept = j < lengths[b] && (!lower_right || j <= i + lengths[b] - p.seqlen_q);
          keep[((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k + j] = kept;
        }
      }
    }
  }
  return keep;
}

struct Gradients {
  HostTensor dq, dk, dv;
};

// The reference backward of `fwd` (its out and lse from the reference) with a fixed dout,
// gradients poisoned first.
Gradients reference_gradients(Problem& fwd) {
  const HostTensor out = fwd.reference(/*with_lse=*/true);
  std::vector<double> lse = fwd.lse;
  HostTensor dout(fwd.dtype, out.size());
  fill_random(dout, 5);
  Gradients g{HostTensor(fwd.dtype, fwd.q.size()), HostTensor(fwd.dtype, fwd.k.size()),
              HostTensor(fwd.dtype, fwd.v.size())};
  g.dq.poison();
  g.dk.poison();
  g.dv.poison();
  AttentionBackwardParams bp;
  bp.forward = fwd.params;
  bp.forward.out = const_cast<void*>(out.data());
  bp.forward.lse = lse.data();
  bp.dout = dout.data();
  bp.dout_strides = fwd.params.out_strides;
  bp.dq_strides = fwd.params.q_strides;
  bp.dk_strides = fwd.params.k_strides;
  bp.dv_strides = fwd.params.v_strides;
  bp.dq = g.dq.data();
  bp.dk = g.dk.data();
  bp.dv = g.dv.data();
  reference_attention_backward(bp);
  return g;
}

void expect_identical(const HostTensor& a, const HostTensor& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (int64_t i = 0; i < a.size(); ++i) {
    ASSERT_FALSE(std::isnan(a.get(i))) << what << " element " << i << " is NaN";
    ASSERT_EQ(a.get(i), b.get(i)) << what << " element " << i;
  }
}

// The reference with cache_seqlens is the reference with the equivalent element mask, to the
// bit (the same keys in the same order), forward and backward: the rows past an entry's
// length get zero gradients there too (no query sees them).
TEST(CacheSeqlensReference, EqualsTheEquivalentElementMask) {
  for (const LengthsCase& c : kCases) {
    SCOPED_TRACE(c.name);
    Problem with_lengths(c.shape, DType::kFloat64, true, 3);
    with_lengths.params.causal = c.causal;
    with_lengths.params.kv_stride = c.kv_stride;
    with_lengths.params.mask.window_left = c.window_left;
    Problem with_mask = with_lengths;
    with_mask.bind_host();
    with_lengths.params.mask.causal_lower_right = c.lower_right;
    with_lengths.params.mask.cache_seqlens = c.lengths.data();
    const std::vector<uint8_t> keep = equivalent_mask(with_mask.params, c.lengths, c.lower_right);
    MaskOptions& m = with_mask.params.mask;
    m.data = keep.data();
    m.dtype = MaskDType::kBool;
    m.col_stride = 1;
    m.row_stride = c.shape.seqlen_k;
    m.head_stride = c.shape.seqlen_q * c.shape.seqlen_k;
    m.batch_stride = c.shape.heads_q * m.head_stride;
    const HostTensor by_lengths = with_lengths.reference(true);
    const std::vector<double> lse_by_lengths = with_lengths.lse;
    const HostTensor by_mask = with_mask.reference(true);
    expect_identical(by_lengths, by_mask, "out");
    for (size_t r = 0; r < lse_by_lengths.size(); ++r) {
      ASSERT_EQ(lse_by_lengths[r], with_mask.lse[r]) << "lse row " << r;
    }
    const Gradients a = reference_gradients(with_lengths);
    const Gradients b = reference_gradients(with_mask);
    expect_identical(a.dq, b.dq, "dq");
    expect_identical(a.dk, b.dk, "dk");
    expect_identical(a.dv, b.dv, "dv");
  }
}

// The per-entry decomposition's views (batch_entry_params), run through the reference one entry
// at a time, give the whole call's result to the bit: q, k, v, out, lse, an element mask with
// its own batch stride and a block map moved to each entry.
TEST(CacheSeqlensDecomposition, EntryCallsComposeTheWholeCall) {
  const Shape shape{3, 4, 2, 6, 50, 8, 8};
  const std::vector<int32_t> lengths = {50, 0, 23};
  Problem whole(shape, DType::kFloat32, true, 9);
  whole.params.mask.causal_lower_right = true;
  whole.params.mask.cache_seqlens = lengths.data();
  std::vector<uint8_t> keep(shape.batch * shape.heads_q * shape.seqlen_q * shape.seqlen_k);
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = (i * 7919) % 10 >= 2;
  MaskOptions& m = whole.params.mask;
  m.data = keep.data();
  m.col_stride = 1;
  m.row_stride = shape.seqlen_k;
  m.head_stride = shape.seqlen_q * shape.seqlen_k;
  m.batch_stride = shape.heads_q * m.head_stride;
  const int64_t map_rows = 2, map_cols = 4;  // blocks of 4 queries x 16 keys
  std::vector<uint8_t> map(shape.batch * map_rows * map_cols);
  for (size_t i = 0; i < map.size(); ++i) map[i] = i % 5 != 1;
  m.block_map = map.data();
  m.block_q = 4;
  m.block_k = 16;
  m.block_batch_stride = map_rows * map_cols;
  m.block_row_stride = map_cols;
  m.block_col_stride = 1;
  const HostTensor expected = whole.reference(true);
  const std::vector<double> expected_lse = whole.lse;

  HostTensor out(DType::kFloat32, whole.out.size());
  out.poison();
  std::vector<float> lse(expected_lse.size(), std::nanf(""));
  AttentionParams p = whole.params;
  p.out = out.data();
  p.lse = lse.data();
  for (int64_t b = 0; b < shape.batch; ++b) {
    const AttentionParams entry = detail::batch_entry_params(p, b, lengths[b]);
    EXPECT_EQ(entry.batch, 1);
    EXPECT_EQ(entry.seqlen_k, lengths[b]);
    EXPECT_EQ(entry.mask.cache_seqlens, nullptr);
    reference_attention_forward(entry);
  }
  expect_identical(out, expected, "out");
  for (size_t r = 0; r < lse.size(); ++r) {
    ASSERT_EQ(static_cast<double>(lse[r]), expected_lse[r]) << "lse row " << r;
  }
  const AttentionParams sizing = detail::entry_sizing_params(p);
  EXPECT_EQ(sizing.batch, 1);
  EXPECT_EQ(sizing.seqlen_k, shape.seqlen_k);
}

TEST(CacheSeqlensValidation, NamesTheEntryAndTheConflict) {
  Problem pb({3, 2, 2, 4, 10, 8, 8}, DType::kFloat32);
  const std::vector<int32_t> lengths = {10, 11, 0};
  pb.params.mask.cache_seqlens = lengths.data();
  try {
    pb.reference();
    FAIL() << "a length past seqlen_k must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache_seqlens[1] is 11"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("seqlen_k (10)"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> negative = {10, 3, -1};
  pb.params.mask.cache_seqlens = negative.data();
  EXPECT_THROW(pb.reference(), Error);
  const std::vector<int32_t> cu = {0, 4, 8, 12};
  pb.params.mask.cache_seqlens = lengths.data();
  pb.params.mask.cu_seqlens_q = cu.data();
  pb.params.mask.cu_seqlens_k = cu.data();
  const Status status = can_implement(pb.params);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cache_seqlens"), std::string::npos) << status.message();
}

// The reference reads a paged cache as the dense one it was scattered from, to the bit.
TEST(PagedCacheReference, EqualsTheDenseCache) {
  for (const int64_t page_size : {1, 5, 16, 64}) {
    SCOPED_TRACE(page_size);
    Problem dense({3, 4, 2, 3, 70, 8, 6}, DType::kFloat32, true, 31);
    const std::vector<int32_t> lengths = {70, 0, 33};
    dense.params.mask.cache_seqlens = lengths.data();
    dense.params.mask.causal_lower_right = true;
    const HostTensor want = dense.reference(true);
    const std::vector<double> want_lse = dense.lse;
    PagedCopy paged = scatter_into_pages(dense, page_size, 5);
    AttentionParams p = dense.params;
    bind_pages(p, paged, page_size);
    HostTensor out(DType::kFloat32, want.size());
    out.poison();
    std::vector<float> lse(want_lse.size(), std::nanf(""));
    p.out = out.data();
    p.lse = lse.data();
    reference_attention_forward(p);
    expect_identical(out, want, "out");
    for (size_t r = 0; r < want_lse.size(); ++r) {
      ASSERT_EQ(static_cast<double>(lse[r]), want_lse[r]) << "lse row " << r;
    }
  }
}

TEST(PagedCacheValidation, NamesWhatIsMissing) {
  Problem pb({2, 2, 2, 1, 40, 8, 8}, DType::kFloat32);
  const std::vector<int32_t> lengths = {40, 7};
  PagedCopy paged = scatter_into_pages(pb, 16, 1);
  bind_pages(pb.params, paged, 16);
  EXPECT_NE(can_implement(pb.params).message().find("needs cache_seqlens"), std::string::npos)
      << can_implement(pb.params).message();
  pb.params.mask.cache_seqlens = lengths.data();
  EXPECT_TRUE(can_implement(pb.params).ok()) << can_implement(pb.params).message();
  pb.params.mask.block_table_stride = 2;  // 40 keys in pages of 16: 3 columns
  EXPECT_NE(can_implement(pb.params).message().find("block_table_stride must be >= "
                                                    "ceil(seqlen_k / page_size) = 3"),
            std::string::npos)
      << can_implement(pb.params).message();
  pb.params.mask.block_table_stride = paged.table_stride;
  paged.table[1] = static_cast<int32_t>(paged.pages);  // entry 0's second page: past the pool
  HostTensor out(DType::kFloat32, pb.out.size());
  pb.params.out = out.data();
  try {
    reference_attention_forward(pb.params);
    FAIL() << "a page past the pool must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_table[0, 1] is"), std::string::npos) << e.what();
  }
  AttentionBackwardParams bp;
  bp.forward = pb.params;
  EXPECT_NE(can_implement_backward(bp).message().find("no paged KV cache"), std::string::npos)
      << can_implement_backward(bp).message();
}

// The decoding kernel's page lookup (host-device): the listed page, clamped to the pool, and the
// row in it.
TEST(PagedCacheDecode, RowsComeFromTheirPages) {
  const std::vector<int32_t> table = {7, 2, -4, 99, 5, 0};  // 2 entries x 3 columns
  detail::DecodeKernelParams k{};
  k.block_table = table.data();
  k.block_table_stride = 3;
  k.page_size = 16;
  k.num_pages = 8;
  EXPECT_EQ(detail::decode_paged_row(k, 0, 0).page, 7);
  EXPECT_EQ(detail::decode_paged_row(k, 0, 17).page, 2);
  EXPECT_EQ(detail::decode_paged_row(k, 0, 17).row, 1);
  EXPECT_EQ(detail::decode_paged_row(k, 0, 40).page, 0) << "-4 clamped to the first page";
  EXPECT_EQ(detail::decode_paged_row(k, 1, 15).page, 7) << "99 clamped to the last page";
  EXPECT_EQ(detail::decode_paged_row(k, 1, 15).row, 15);
  EXPECT_EQ(detail::decode_paged_row(k, 1, 47).page, 0);
  EXPECT_EQ(detail::decode_paged_row(k, 1, 47).row, 15);
}

}  // namespace
}  // namespace samattn::testing
