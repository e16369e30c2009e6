// Split-key attention (attention/key_split.h) on the host: the plan covers every key once, and
// the chunks' views, run through the fp64 reference and merged with the kernel's merge
// functions, give the whole call's output and lse. Only the launches themselves need a GPU
// (tests/python/test_key_split.py).
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "attention/key_split.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

using detail::KeySplit;
using detail::plan_key_split;
using detail::SplitTile;

constexpr SplitTile kTile{64, 64, 2};
constexpr int kMultiprocessors = 132;

AttentionParams decode_params(int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_k,
                              int64_t num_splits) {
  AttentionParams p;
  p.dtype = DType::kBFloat16;
  p.batch = batch;
  p.heads_q = p.heads_kv = heads;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = p.head_dim_v = 128;
  p.num_splits = num_splits;
  return p;
}

void expect_covers_every_key(const KeySplit& split, int64_t keys, int64_t block_n) {
  ASSERT_GE(split.parts(), 2);
  EXPECT_EQ(split.chunk_keys % block_n, 0);
  EXPECT_EQ(split.full_chunks * split.chunk_keys + split.tail_keys, keys);
  EXPECT_GE(split.full_chunks, 1);
  EXPECT_LT(split.tail_keys, split.chunk_keys);
}

TEST(KeySplit, PlanCoversEveryKeyOnce) {
  for (int64_t keys : {65, 128, 129, 1000, 4096, 8191, 100000}) {
    for (int64_t splits : {0, 2, 3, 7, 64, 1000}) {
      const KeySplit split =
          plan_key_split(decode_params(1, 8, 1, keys, splits), kMultiprocessors, kTile);
      SCOPED_TRACE(::testing::Message() << "keys " << keys << " num_splits " << splits);
      if (split.parts() == 0) {
        // Declined only when there are too few key blocks to share.
        EXPECT_LT((keys + kTile.block_n - 1) / kTile.block_n, splits == 0 ? 4 : 2);
        continue;
      }
      expect_covers_every_key(split, keys, kTile.block_n);
      if (splits > 1) EXPECT_LE(split.parts(), splits);
      EXPECT_LE(split.parts(), 128);
    }
  }
}

TEST(KeySplit, RightEdgeEndsTheFullChunksWhereEveryQuerySeesThem) {
  // Bottom-right causal, 7 new queries against 4000 keys: row 0 sees positions <= 3993.
  AttentionParams p = decode_params(1, 4, 7, 4000, 4);
  p.mask.window_right = 3993;
  const KeySplit split = plan_key_split(p, kMultiprocessors, kTile);
  ASSERT_GE(split.parts(), 2);
  EXPECT_EQ(split.chunk_keys, 1024);  // ceil(63 / 4) = 16 blocks
  EXPECT_EQ(split.full_chunks, 3);    // 3 * 1024 <= 3993 < 4 * 1024
  EXPECT_EQ(split.tail_keys, 4000 - 3 * 1024);
  std::vector<float> out(4 * 4 * 7 * 128), lse(4 * 4 * 7);
  const auto launches = detail::key_split_launches(p, split, {out.data(), lse.data()});
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_FALSE(launches[0].view.mask.any()) << "the full chunks need no mask";
  EXPECT_EQ(launches[1].view.mask.window_right, 3993 - 3 * 1024);
  EXPECT_LT(launches[1].view.mask.window_left, 0);
}

TEST(KeySplit, KvStrideSplitsTheKeptKeys) {
  AttentionParams p = decode_params(1, 4, 1, 10000, 4);
  p.kv_stride = 3;
  const KeySplit split = plan_key_split(p, kMultiprocessors, kTile);
  expect_covers_every_key(split, (10000 + 2) / 3, kTile.block_n);
}

TEST(KeySplit, AutomaticChunksFillTheResidentBlocks) {
  // 32 query blocks on 132 SMs of two resident blocks: 264 / 32 = 8 chunks (one wave; 9 would
  // be 288 blocks) of 128 / 8 = 16 key blocks (1024 keys), no tail.
  const KeySplit split = plan_key_split(decode_params(1, 32, 1, 8192, 0), kMultiprocessors, kTile);
  EXPECT_EQ(split.chunk_keys, 1024);
  EXPECT_EQ(split.full_chunks, 8);
  EXPECT_EQ(split.tail_keys, 0);
}

TEST(KeySplit, AutomaticDeclinesWhereEachBatchEntryIsALaunch) {
  // (B, S, H, D) caches: the (batch, head) pairs do not merge, so each batch entry is a launch,
  // and launches run one after the other: slower than no split on an H200 (stop 51), so the
  // automatic choice declines. An explicit count still splits, every launch with the chunks a
  // single entry gets.
  AttentionParams p = decode_params(4, 8, 1, 8192, 0);
  p.k_strides = p.v_strides = {8192 * 8 * 128, 128, 8 * 128};
  p.q_strides = {8 * 128, 128, 8 * 128};
  EXPECT_EQ(plan_key_split(p, kMultiprocessors, kTile).parts(), 0);
  p.num_splits = 6;
  EXPECT_EQ(plan_key_split(p, kMultiprocessors, kTile).parts(),
            plan_key_split(decode_params(1, 8, 1, 8192, 6), kMultiprocessors, kTile).parts());
  p.batch = 1;
  p.num_splits = 0;
  EXPECT_GT(plan_key_split(p, kMultiprocessors, kTile).parts(), 0) << "one entry, one launch";
}

TEST(KeySplit, PlanDeclines) {
  const auto parts = [](const AttentionParams& p) {
    return plan_key_split(p, kMultiprocessors, kTile).parts();
  };
  const AttentionParams base = decode_params(1, 8, 1, 8192, 0);
  ASSERT_GT(parts(base), 0);
  AttentionParams p = base;
  p.num_splits = 1;
  EXPECT_EQ(parts(p), 0) << "num_splits 1 never splits";
  p = base;
  p.dtype = DType::kFloat32;
  EXPECT_EQ(parts(p), 0) << "float32 runs on other kernels";
  p = base;
  p.causal = true;
  EXPECT_EQ(parts(p), 0) << "causal would need a key offset per chunk";
  p = base;
  p.mask.window_left = 100;
  EXPECT_EQ(parts(p), 0) << "a left edge would need a key offset per chunk";
  p = base;
  const float zero = 0.f;
  p.mask.data = &zero;  // an element mask splits with the keys (its columns per chunk)
  p.mask.dtype = MaskDType::kFloat32;
  EXPECT_GT(parts(p), 0);
  p.mask.block_map = reinterpret_cast<const uint8_t*>(&zero);
  EXPECT_EQ(parts(p), 0) << "a block map's columns are blocks of another size";
  p = base;
  p.mask.window_right = 8191 - 4;  // bottom-right causal with 5 new queries
  EXPECT_EQ(parts(p), 0) << "automatic: a right edge takes a second launch (its last chunk)";
  p.num_splits = 8;
  EXPECT_GT(parts(p), 0) << "a right edge past whole chunks splits";
  p.mask.window_right = 100;
  EXPECT_EQ(parts(p), 0) << "a right edge before the first chunk's end leaves no full chunk";
  // Enough query blocks to fill the device: 264 resident blocks.
  EXPECT_EQ(parts(decode_params(33, 8, 1, 8192, 0)), 0);
  EXPECT_GT(parts(decode_params(33, 8, 1, 8192, 4)), 0) << "an explicit count still splits";
  // Three key blocks: chunks of one block would cost more than they share.
  EXPECT_EQ(parts(decode_params(1, 8, 1, 3 * kTile.block_n, 0)), 0);
  EXPECT_EQ(parts(decode_params(1, 8, 0, 8192, 0)), 0) << "no queries";
  EXPECT_EQ(parts(decode_params(1, 8, 1, 0, 0)), 0) << "no keys";
}

TEST(KeySplit, MergeOfRowsWithoutKeys) {
  const float none[] = {-INFINITY, -INFINITY, -INFINITY};
  const float outs[] = {1.f, 2.f, 3.f};
  EXPECT_EQ(detail::merged_lse(none, 3, 1), -INFINITY);
  EXPECT_EQ(detail::merged_value(outs, none, 3, 1, 1, -INFINITY), 0.f);
  // A chunk without keys (lse -inf) adds nothing, whatever its output holds.
  const float lse[] = {0.5f, -INFINITY};
  const float values[] = {4.f, NAN};
  const float merged = detail::merged_lse(lse, 2, 1);
  EXPECT_FLOAT_EQ(merged, 0.5f);
  EXPECT_FLOAT_EQ(detail::merged_value(values, lse, 2, 1, 1, merged), 4.f);
}

TEST(KeySplit, MergeOfANanChunkIsNan) {
  // A chunk whose scores held a NaN has lse NaN: the row's lse and output are NaN, even when
  // the NaN chunk comes after finite ones and the others saw no key.
  for (const float other : {0.5f, -INFINITY}) {
    const float lse[] = {other, NAN};
    const float values[] = {4.f, NAN};
    const float merged = detail::merged_lse(lse, 2, 1);
    EXPECT_TRUE(std::isnan(merged)) << other;
    EXPECT_TRUE(std::isnan(detail::merged_value(values, lse, 2, 1, 1, merged))) << other;
  }
  // A NaN output (a NaN value row the chunk saw) counts even where its weight underflows to 0.
  const float lse[] = {0.f, -200.f};
  const float values[] = {4.f, NAN};
  const float merged = detail::merged_lse(lse, 2, 1);
  EXPECT_FLOAT_EQ(merged, 0.f);
  EXPECT_TRUE(std::isnan(detail::merged_value(values, lse, 2, 1, 1, merged)));
}

TEST(KeySplit, PackedQueryHeadsComputeTheSameRows) {
  struct PackCase {
    const char* name;
    Shape shape;
    bool seq_major;
    bool causal;
    bool out_seq_major;
    bool packs;
  };
  const PackCase cases[] = {
      {"decode_seq_major", {2, 8, 2, 1, 50, 16, 16}, true, false, false, true},
      {"rows_heads_major", {2, 6, 2, 5, 40, 16, 8}, false, false, false, true},
      {"rows_seq_major", {2, 6, 2, 5, 40, 16, 16}, true, false, false, false},
      {"rows_out_seq_major", {2, 6, 2, 5, 40, 16, 16}, false, false, true, false},
      {"causal", {1, 4, 2, 5, 40, 16, 16}, false, true, false, false},
      {"no_group", {1, 4, 4, 1, 40, 16, 16}, false, false, false, false},
  };
  for (const PackCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem problem(c.shape, DType::kFloat64, c.seq_major, 5);
    problem.params.causal = c.causal;
    if (c.out_seq_major) {
      problem.params.out_strides =
          Problem::strides(c.shape.heads_q, c.shape.seqlen_q, c.shape.head_dim_v, true);
    }
    const HostTensor whole = problem.reference(true);
    const std::vector<double> whole_lse = problem.lse;
    const AttentionParams packed = detail::packed_query_heads(problem.params);
    EXPECT_EQ(packed.heads_q != problem.params.heads_q, c.packs);
    // The packed call writes the same memory: every output element and lse bit for bit.
    problem.params = packed;
    const HostTensor again = problem.reference(true);
    EXPECT_EQ(again.bytes, whole.bytes);
    EXPECT_EQ(problem.lse, whole_lse);
  }
}

// Element masks of the split tests: none; key padding (B, 1, 1, Sk), with which the heads do not
// merge (one launch per batch entry); additive (B, H, Sq, Sk) with one row fully hidden.
enum class MaskKind { kNone, kKeyPadding, kAdditive };

struct SplitCase {
  const char* name;
  Shape shape;
  bool seq_major;
  int64_t kv_stride;
  int64_t num_splits;
  bool packs;                 // grouped query heads packed as rows (packed_query_heads)
  int64_t window_right = -1;  // a right edge (bottom-right causal: seqlen_k - seqlen_q)
  MaskKind mask = MaskKind::kNone;
};

// An element mask's host memory: key padding as bool bytes, additive as float32.
struct MaskStorage {
  std::vector<unsigned char> keep;
  std::vector<float> bias;
};

// Gives `p` an element mask of `kind` held in `storage`, with broadcast strides 0: key padding
// (B, 1, 1, Sk) bool, true before a length per batch entry; additive (B, H, Sq, Sk) float32,
// random, with row 0 of (0, 0) fully hidden (-inf).
void attach_mask(AttentionParams& p, MaskKind kind, MaskStorage& storage) {
  if (kind == MaskKind::kNone) return;
  if (kind == MaskKind::kKeyPadding) {
    storage.keep.assign(p.batch * p.seqlen_k, 0);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t length = p.seqlen_k / 3 + b * 97 % (p.seqlen_k / 2);
      std::fill_n(storage.keep.begin() + b * p.seqlen_k, length, 1);
    }
    p.mask.data = storage.keep.data();
    p.mask.dtype = MaskDType::kBool;
    p.mask.batch_stride = p.seqlen_k;
    p.mask.head_stride = p.mask.row_stride = 0;
  } else {
    std::mt19937_64 engine(23);
    std::uniform_real_distribution<float> uniform(-2.f, 2.f);
    storage.bias.resize(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k);
    for (float& x : storage.bias) x = uniform(engine);
    std::fill_n(storage.bias.begin(), p.seqlen_k, -INFINITY);
    p.mask.data = storage.bias.data();
    p.mask.dtype = MaskDType::kFloat32;
    p.mask.batch_stride = p.heads_q * p.seqlen_q * p.seqlen_k;
    p.mask.head_stride = p.seqlen_q * p.seqlen_k;
    p.mask.row_stride = p.seqlen_k;
  }
  p.mask.col_stride = 1;
}

// Runs each chunk launch through the fp64 reference (float32 in and out) into a workspace laid
// out as the kernels' (lse at the launch's strides), merges it with merged_lse / merged_value,
// and compares with the unsplit reference.
void check_split_equals_whole(const SplitCase& c) {
  SCOPED_TRACE(c.name);
  Problem problem(c.shape, DType::kFloat32, c.seq_major, 11);
  problem.params.kv_stride = c.kv_stride;
  problem.params.num_splits = c.num_splits;
  problem.params.mask.window_right = c.window_right;
  MaskStorage mask;
  attach_mask(problem.params, c.mask, mask);
  const HostTensor whole = problem.reference(true);
  const std::vector<double> whole_lse = problem.lse;

  // As the GPU path: the query heads packed, then planned. The plan looks at the dtype only to
  // decline; the views do not depend on it.
  const AttentionParams p = detail::packed_query_heads(problem.params);
  EXPECT_EQ(p.heads_q != problem.params.heads_q, c.packs);
  AttentionParams planned = p;
  planned.dtype = DType::kBFloat16;
  const KeySplit split = plan_key_split(planned, kMultiprocessors, kTile);
  ASSERT_GE(split.parts(), 2);

  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  std::vector<unsigned char> workspace(detail::key_split_workspace_bytes(p, split));
  const detail::PriorPart ws = detail::carve_split_workspace(workspace.data(), p, split);
  std::fill(ws.out, ws.out + split.parts() * rows * p.head_dim_v, NAN);
  std::fill(ws.lse, ws.lse + split.parts() * rows, NAN);

  // The launch's batch entries [first, first + count), each with seqlen_k keys, through the
  // reference; lse goes where the kernel would write it.
  const auto run_entries = [](const detail::SplitLaunch& launch, int64_t first, int64_t count,
                              int64_t seqlen_k) {
    AttentionParams view = launch.view;
    const int element_bytes = dtype_size(view.dtype);
    view.batch = count;
    view.seqlen_k = seqlen_k;
    view.k = static_cast<const char*>(view.k) + first * view.k_strides.batch * element_bytes;
    view.v = static_cast<const char*>(view.v) + first * view.v_strides.batch * element_bytes;
    view.out = static_cast<float*>(view.out) + first * view.out_strides.batch;
    if (view.mask.has_element_mask()) {  // attach_mask's masks: bool or float32
      const int64_t mask_bytes = view.mask.dtype == MaskDType::kBool ? 1 : sizeof(float);
      view.mask.data =
          static_cast<const char*>(view.mask.data) + first * view.mask.batch_stride * mask_bytes;
    }
    const int64_t heads = view.heads_q, seq = view.seqlen_q;
    std::vector<float> lse(count * heads * seq);
    float* lse_at = static_cast<float*>(view.lse) + first * launch.lse_batch_stride;
    view.lse = lse.data();
    reference_attention_forward(view);
    for (int64_t b = 0; b < count; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < seq; ++i) {
          lse_at[b * launch.lse_batch_stride + h * launch.lse_head_stride + i] =
              lse[(b * heads + h) * seq + i];
        }
      }
    }
  };
  int64_t chunks_run = 0, tails_in_launch = 0;
  for (const detail::SplitLaunch& launch : detail::key_split_launches(p, split, ws)) {
    const AttentionParams& view = launch.view;
    const int64_t last = launch.last_chunk_seqlen_k;
    if (last > 0) {
      // The tail, shorter, is the launch's last batch entry (the kernel's last_batch_kept_keys).
      EXPECT_LT(last, view.seqlen_k);
      run_entries(launch, 0, view.batch - 1, view.seqlen_k);
      run_entries(launch, view.batch - 1, 1, last);
      ++tails_in_launch;
    } else {
      run_entries(launch, 0, view.batch, view.seqlen_k);
    }
    chunks_run += view.batch * view.heads_q / p.heads_q;
  }
  // Without a window the tail runs in the launch of the full chunks.
  if (split.tail_keys > 0 && c.window_right < 0) {
    EXPECT_EQ(tails_in_launch * (detail::chunk_heads_merge(p) ? p.batch : 1), p.batch);
  }
  EXPECT_EQ(chunks_run, split.parts() * p.batch) << "every (chunk, batch entry) once";

  const int64_t dim_v = p.head_dim_v;
  const Tolerance tol = tolerance_for(DType::kFloat32);
  const double scale = max_abs(whole);
  for (int64_t row = 0; row < rows; ++row) {
    const float merged = detail::merged_lse(ws.lse + row, split.parts(), rows);
    if (std::isinf(whole_lse[row])) {
      ASSERT_EQ(merged, whole_lse[row]) << "row " << row;
    } else {
      ASSERT_NEAR(merged, whole_lse[row], 1e-5 * std::max(1.0, std::abs(whole_lse[row])));
    }
    for (int64_t d = 0; d < dim_v; ++d) {
      const double got = detail::merged_value(ws.out + row * dim_v + d, ws.lse + row, split.parts(),
                                              rows * dim_v, rows, merged);
      const double want = whole.get(row * dim_v + d);
      ASSERT_NEAR(got, want, tol.rtol * std::abs(want) + tol.atol * scale)
          << "row " << row << " column " << d;
    }
  }
}

TEST(KeySplit, ChunksMergedEqualTheWholeCall) {
  // num_splits 0 (automatic) where one launch takes every chunk; explicit counts elsewhere.
  const SplitCase cases[] = {
      {"decode_gqa", {2, 8, 2, 1, 1000, 32, 32}, false, 1, 0, true},
      // 1000 keys / 17 chunks: a tail, in the full chunks' launch.
      {"tail_in_the_launch", {1, 4, 1, 1, 1000, 16, 16}, false, 1, 17, true},
      {"decode_gqa_seq_major", {3, 8, 2, 1, 1000, 32, 32}, true, 1, 6, true},
      {"decode_seq_major", {3, 4, 4, 1, 700, 16, 16}, true, 1, 5, false},
      {"rows_seq_major_gqa", {2, 6, 3, 5, 333, 8, 8}, true, 1, 3, false},
      {"kv_stride", {2, 4, 2, 3, 1001, 16, 16}, false, 3, 2, true},
      {"more_rows_than_a_block", {1, 2, 1, 70, 600, 16, 16}, false, 1, 4, true},
      {"tail_of_one_key", {1, 2, 2, 2, 129, 16, 16}, false, 1, 2, false},
      {"many_chunks", {1, 2, 1, 1, 5000, 8, 8}, false, 1, 100, true},
      {"lower_right_gqa", {2, 4, 2, 6, 1500, 16, 16}, false, 1, 3, false, 1494},
      {"lower_right_seq_major", {1, 4, 4, 9, 700, 16, 16}, true, 1, 6, false, 691},
      {"right_edge_kv_stride", {2, 2, 1, 4, 2000, 8, 8}, false, 3, 5, false, 1200},
      // Chunks of 128 keys and r = 255: a last chunk starting at 256 would see its window
      // become -1 (unbounded); the full chunks must stop at 128.
      {"right_edge_one_before_a_chunk_end", {1, 2, 2, 145, 400, 8, 8}, false, 1, 4, false, 255},
      {"key_padding_gqa", {3, 4, 2, 1, 900, 16, 16}, true, 1, 6, false, -1, MaskKind::kKeyPadding},
      {"additive_rows", {2, 2, 2, 5, 700, 8, 8}, false, 1, 3, false, -1, MaskKind::kAdditive},
      // q, k and v merge their (batch, head) pairs, the padding mask (stride 0 over heads) not.
      {"key_padding_heads_major",
       {2, 4, 2, 1, 600, 16, 16},
       false,
       1,
       2,
       false,
       -1,
       MaskKind::kKeyPadding},
      {"additive_right_edge_kv_stride",
       {2, 2, 1, 4, 1400, 8, 8},
       false,
       2,
       4,
       false,
       1000,
       MaskKind::kAdditive},
  };
  for (const SplitCase& c : cases) check_split_equals_whole(c);
}

}  // namespace
}  // namespace samattn::testing
