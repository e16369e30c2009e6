// The decoding kernel (attention/decode.h) on the host: which calls it takes, its plan, its
// parameters, and a replay of its work split. The replay walks every block, warp, 64-key tile
// and 16-key slice with the geometry functions the kernel calls (decode_chunk, decode_row_end,
// decode_warp_role) and the kernel's masking rule, in fp64, merges the warps' states as the
// kernel does and the chunks with the split's merge functions: every visible key must be
// counted exactly once, no hidden one ever, and the result must equal the definition. Only the
// mma fragments and the copies need a GPU (tests/cpp/test_tensor_core_gpu.cpp, DecodeKernelGpu).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "attention/decode.h"
#include "attention/key_split.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

using detail::KeySplit;

AttentionParams decode_call(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q,
                            int64_t seqlen_k, int64_t num_splits) {
  AttentionParams p;
  p.dtype = DType::kBFloat16;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = p.head_dim_v = 128;
  p.num_splits = num_splits;
  return p;
}

TEST(DecodePlan, TakesOnlyItsCalls) {
  const AttentionParams p = decode_call(2, 32, 8, 1, 4096, 0);
  EXPECT_TRUE(detail::decode_kernel_takes(p).ok()) << detail::decode_kernel_takes(p).message();
  const auto declined = [](const AttentionParams& changed, const char* named) {
    const Status status = detail::decode_kernel_takes(changed);
    EXPECT_FALSE(status.ok()) << named;
    EXPECT_NE(status.message().find(named), std::string::npos) << status.message();
  };
  AttentionParams q = p;
  q.dtype = DType::kFloat32;
  declined(q, "dtype float32");
  q = p;
  q.head_dim = q.head_dim_v = 80;
  declined(q, "head_dim 80");
  for (int64_t dim : {64, 96, 128, 192, 256}) {
    q.head_dim = q.head_dim_v = dim;
    EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << dim;
  }
  q = p;
  q.head_dim_v = 64;
  declined(q, "head_dim_v 64");
  q = p;
  q.kv_stride = 2;
  declined(q, "kv_stride 2");
  q = p;
  q.causal = true;
  declined(q, "causal");
  q = p;
  q.mask.window_left = 100;
  declined(q, "mask options");
  q = p;
  q.mask.causal_lower_right = true;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "bottom-right causal";
  const int32_t lengths[2] = {4000, 17};
  q.mask.cache_seqlens = lengths;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "cache_seqlens";
  // A window following bottom-right causal: without a left edge it changes nothing (its right
  // edge lies past the causal one), so the kernel runs it without that edge.
  q.mask.window_follows_causal = true;
  q.mask.window_right = 3;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "window_follows_causal, right edge only";
  EXPECT_EQ(detail::make_decode_kernel_params(q, detail::plan_decode(q, 264), {}).right_edge, -1);
  // Its left edge is the kernel's (sliding-window decoding); a left edge centred on j = i is not.
  q.mask.window_left = 100;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "sliding-window decoding";
  EXPECT_EQ(detail::make_decode_kernel_params(q, detail::plan_decode(q, 264), {}).window_left, 100);
  q.mask.window_follows_causal = false;
  declined(q, "mask options");
  q = p;
  q.seqlen_q = 17;  // 4 query heads per kv head: 68 rows
  declined(q, "68 rows");
  q.seqlen_q = 16;  // 64 rows
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok());
  q = p;
  q.seqlen_q = 5;
  q.mask.window_right = 4091;  // bottom-right causal drafts
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok());
  q = p;
  q.batch = 70000;
  declined(q, "batch 70000");
  q = p;
  q.seqlen_q = 0;
  declined(q, "empty calls");
  // attn_mask: a key mask only, the same for every head and query row.
  const unsigned char keep[1] = {1};
  q = p;
  q.mask.data = keep;
  q.mask.batch_stride = 4096;
  q.mask.col_stride = 1;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "a padded batch's (B, 1, 1, Sk) mask";
  q.mask.row_stride = 4096;
  EXPECT_TRUE(detail::decode_kernel_takes(q).ok()) << "one query: its row stride is unused";
  q.seqlen_q = 2;
  declined(q, "varies over heads or query rows");
  q.seqlen_q = 1;
  q.mask.head_stride = 4096;
  declined(q, "varies over heads or query rows");
}

TEST(DecodePlan, ChunksCoverTheVisibleKeysOnce) {
  for (int64_t keys : {1, 37, 64, 65, 1000, 4096, 20000, 100000}) {
    for (int64_t splits : {0, 2, 3, 7, 64, 1000}) {
      for (int64_t right_edge : {int64_t{-1}, int64_t{0}, int64_t{62}, keys - 1,
                                 std::numeric_limits<int64_t>::max() - 1}) {
        AttentionParams p = decode_call(1, 8, 8, 1, keys, splits);
        p.mask.window_right = right_edge;
        const KeySplit split = detail::plan_decode(p, 264);
        SCOPED_TRACE(::testing::Message() << "keys " << keys << " num_splits " << splits
                                          << " right edge " << right_edge);
        const int64_t visible = right_edge < 0 || right_edge >= keys ? keys : 1 + right_edge;
        EXPECT_TRUE(split.on_decode_kernel);
        ASSERT_GE(split.parts(), 1);
        EXPECT_EQ(split.chunk_keys % detail::kDecodeBlockN, 0);
        EXPECT_EQ(split.full_chunks * split.chunk_keys + split.tail_keys, visible);
        EXPECT_LT(split.tail_keys, split.chunk_keys);
        EXPECT_LE(split.parts(), 128);
        if (splits > 1) EXPECT_LE(split.parts(), splits);
        EXPECT_EQ(detail::split_needs_workspace(split), split.parts() > 1);
      }
    }
  }
}

TEST(DecodePlan, AutomaticChunksFillTheResidentBlocksInOneLaunch) {
  // B = 1, 8 kv heads, 16k keys, 264 resident blocks: 33 chunks asked, 256 tiles of 64 keys
  // in chunks of 8 tiles: 32 chunks, 256 blocks.
  AttentionParams p = decode_call(1, 32, 8, 1, 16384, 0);
  KeySplit split = detail::plan_decode(p, 264);
  EXPECT_EQ(split.chunk_keys, 512);
  EXPECT_EQ(split.parts(), 32);
  // B = 4 with (B, S, H, D) caches: still one launch (the batch is the grid's third index),
  // 8 chunks of 32 tiles: 256 blocks, one wave (9 would be 288, two waves).
  p.batch = 4;
  split = detail::plan_decode(p, 264);
  EXPECT_EQ(split.parts(), 8);
  EXPECT_LE(split.parts() * p.batch * p.heads_kv, 264);
  // 32 kv heads: 8 chunks, not ceil(264 / 32) = 9.
  p.batch = 1;
  p.heads_q = p.heads_kv = 32;
  split = detail::plan_decode(p, 264);
  EXPECT_EQ(split.parts(), 8);
  // Blocks that already fill the device: one chunk, written directly.
  p.batch = 64;
  p.seqlen_k = 2048;
  split = detail::plan_decode(p, 264);
  EXPECT_EQ(split.parts(), 1);
  EXPECT_FALSE(detail::split_needs_workspace(split));
}

TEST(DecodePlan, KernelParametersMapRowsToHeadsAndQueries) {
  AttentionParams p = decode_call(2, 32, 8, 5, 3000, 4);
  p.mask.window_right = 2995;
  p.softmax_scale = 0.5;
  const KeySplit split = detail::plan_decode(p, 264);
  ASSERT_EQ(split.parts(), 4);
  std::vector<float> out(1), lse(1);
  const detail::DecodeKernelParams k =
      detail::make_decode_kernel_params(p, split, {out.data(), lse.data()});
  EXPECT_EQ(k.group, 4);
  EXPECT_EQ(k.seqlen_q, 5);
  EXPECT_EQ(k.right_edge, 2995);
  EXPECT_EQ(k.chunk_keys, split.chunk_keys);
  EXPECT_EQ(k.parts, 4);
  EXPECT_EQ(k.part_out, out.data());
  EXPECT_EQ(k.part_lse, lse.data());
  EXPECT_EQ(k.workspace_rows, 2 * 32 * 5);
  EXPECT_FLOAT_EQ(k.scale_log2, static_cast<float>(0.5 * M_LOG2E));
  p.mask.window_right = -1;
  p.num_splits = 0;
  p.batch = 1000;
  const KeySplit one = detail::plan_decode(p, 264);
  ASSERT_EQ(one.parts(), 1);
  const detail::DecodeKernelParams direct = detail::make_decode_kernel_params(p, one, {});
  EXPECT_EQ(direct.right_edge, -1);
  // A right edge at or past the last key hides nothing: no edge (and no overflow of T + r).
  p.mask.window_right = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(detail::make_decode_kernel_params(p, one, {}).right_edge, -1);
  p.mask.window_right = 2999;
  EXPECT_EQ(detail::make_decode_kernel_params(p, one, {}).right_edge, 2999);
  EXPECT_EQ(direct.part_out, nullptr) << "one chunk writes the output itself";
}

// One warp's softmax state for one row, in fp64 and the log2 domain, as the kernel keeps it.
struct RowState {
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  std::vector<double> out;
};

struct Replay {
  std::vector<double> out, lse;  // (B, Hq, Sq, D) and (B, Hq, Sq), the merged result
  std::map<std::pair<int64_t, int64_t>, int> seen;  // (query row, key) -> times counted
};

// Replays the kernel's blocks for `pb` with `split`; `keep` (batch, seqlen_k), when given, is a
// boolean key mask (false: the key's score is -inf, which the online softmax turns into weight
// 0 or leaves the row's state empty).
Replay replay_decode(const Problem& pb, const KeySplit& split,
                     const std::vector<char>* keep = nullptr) {
  const AttentionParams& p = pb.params;
  const int64_t dim = p.head_dim;
  std::vector<float> part_out(split.parts() * p.batch * p.heads_q * p.seqlen_q * dim);
  std::vector<float> part_lse(split.parts() * p.batch * p.heads_q * p.seqlen_q);
  const detail::DecodeKernelParams k =
      detail::make_decode_kernel_params(p, split, {part_out.data(), part_lse.data()});
  const int rows = static_cast<int>(k.group * k.seqlen_q);
  const int warps = detail::kDecodeThreads / 32;
  // The exact scale (the kernel's is its float rounding): the replay checks the work split and
  // the merges, which must hold to fp64 rounding.
  const double scale_log2 = default_softmax_scale(dim) * M_LOG2E;
  Replay replay;
  replay.out.assign(p.batch * p.heads_q * p.seqlen_q * dim, 0.0);
  replay.lse.assign(p.batch * p.heads_q * p.seqlen_q, 0.0);
  std::vector<double> chunk_out(split.parts() * replay.lse.size() * dim);
  std::vector<double> chunk_lse(split.parts() * replay.lse.size());
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_kv; ++h) {
      for (int64_t c = 0; c < split.parts(); ++c) {
        const detail::DecodeChunk chunk = detail::decode_chunk(k, c, b);
        std::vector<std::vector<RowState>> state(warps, std::vector<RowState>(16));
        for (int w = 0; w < warps; ++w) {
          const detail::DecodeWarpRole role = detail::decode_warp_role(rows, w, warps);
          if (!role.computes()) continue;
          for (RowState& s : state[w]) s.out.assign(dim, 0.0);
          for (int64_t tile = 0; tile < chunk.tiles; ++tile) {
            for (int slice = role.phase; slice < 4; slice += role.phases) {
              const int64_t first = tile * detail::kDecodeBlockN + slice * 16;
              if (first >= chunk.any_end) break;
              const bool needs_mask = first + 16 > chunk.all_end;
              const int64_t left_mask_end = chunk.has_left ? chunk.first_begin + k.seqlen_q - 1 : 0;
              for (int tile_row = 0; tile_row < 16; ++tile_row) {
                const int row = role.row_tile * 16 + tile_row;
                const int64_t limit = std::max<int64_t>(
                    -1, std::min<int64_t>(detail::decode_row_end(k, chunk, row, rows) - first, 16));
                const int64_t start = std::max<int64_t>(
                    0,
                    std::min<int64_t>(detail::decode_row_begin(k, chunk, row, rows) - first, 16));
                for (int key = 0; key < 16; ++key) {
                  if (needs_mask && key >= limit) continue;
                  if (first < left_mask_end && key < start) continue;
                  if (row >= rows) continue;  // padding rows are never stored
                  const int64_t j = chunk.begin + first + key;
                  const int64_t hq = h * k.group + row / k.seqlen_q, t = row % k.seqlen_q;
                  ++replay.seen[{((b * p.heads_q + hq) * p.seqlen_q + t), j}];
                  if (j >= p.seqlen_k) continue;  // counted above: the check below fails
                  if (keep != nullptr && !(*keep)[b * p.seqlen_k + j]) continue;
                  double dot = 0;
                  for (int64_t d = 0; d < dim; ++d) {
                    dot += pb.q.get(b * p.q_strides.batch + hq * p.q_strides.head +
                                    t * p.q_strides.seq + d) *
                           pb.k.get(b * p.k_strides.batch + h * p.k_strides.head +
                                    j * p.k_strides.seq + d);
                  }
                  RowState& s = state[w][tile_row];
                  const double score = dot * scale_log2, new_max = std::max(s.max, score);
                  const double rescale = std::exp2(s.max - new_max),
                               weight = std::exp2(score - new_max);
                  s.sum = s.sum * rescale + weight;
                  for (int64_t d = 0; d < dim; ++d) {
                    s.out[d] = s.out[d] * rescale +
                               weight * pb.v.get(b * p.v_strides.batch + h * p.v_strides.head +
                                                 j * p.v_strides.seq + d);
                  }
                  s.max = new_max;
                }
              }
            }
          }
        }
        // The phases' merge, as at the kernel's end.
        for (int row = 0; row < rows; ++row) {
          const detail::DecodeWarpRole role = detail::decode_warp_role(rows, 0, warps);
          double largest = -std::numeric_limits<double>::infinity();
          for (int ph = 0; ph < role.phases; ++ph) {
            largest = std::max(largest, state[row / 16 + ph * role.row_tiles][row % 16].max);
          }
          const double shift = std::isinf(largest) ? 0 : largest;
          double total = 0;
          std::vector<double> value(dim, 0.0);
          for (int ph = 0; ph < role.phases; ++ph) {
            const RowState& s = state[row / 16 + ph * role.row_tiles][row % 16];
            const double weight = std::exp2(s.max - shift);
            total += weight * s.sum;
            for (int64_t d = 0; d < dim; ++d) value[d] += weight * s.out[d];
          }
          const int64_t hq = h * k.group + row / k.seqlen_q, t = row % k.seqlen_q;
          const int64_t part_row = c * k.workspace_rows + (b * p.heads_q + hq) * p.seqlen_q + t;
          chunk_lse[part_row] = total == 0 ? -std::numeric_limits<double>::infinity()
                                           : (largest + std::log2(total)) * M_LN2;
          for (int64_t d = 0; d < dim; ++d) {
            chunk_out[part_row * dim + d] = total == 0 ? 0 : value[d] / total;
          }
        }
      }
    }
  }
  // The split's merge, in fp64 (the kernel's merged_lse/merged_value in fp32).
  const int64_t all_rows = k.workspace_rows;
  for (int64_t r = 0; r < all_rows; ++r) {
    double largest = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < split.parts(); ++c) {
      largest = std::max(largest, chunk_lse[c * all_rows + r]);
    }
    // As merged_lse / merged_value: a row without keys in any chunk is -inf and 0; a chunk
    // without keys adds nothing.
    if (std::isinf(largest)) {
      replay.lse[r] = largest;
      continue;
    }
    double sum = 0;
    for (int64_t c = 0; c < split.parts(); ++c) {
      sum += std::exp(chunk_lse[c * all_rows + r] - largest);
    }
    replay.lse[r] = largest + std::log(sum);
    for (int64_t d = 0; d < dim; ++d) {
      double value = 0;
      for (int64_t c = 0; c < split.parts(); ++c) {
        if (std::isinf(chunk_lse[c * all_rows + r])) continue;
        value += std::exp(chunk_lse[c * all_rows + r] - replay.lse[r]) *
                 chunk_out[(c * all_rows + r) * dim + d];
      }
      replay.out[r * dim + d] = value;
    }
  }
  return replay;
}

// The keys [0, end) that query t of batch entry b sees by the definition: the entry's keys
// (cache_seqlens[b] or seqlen_k), then j <= t + the window's right edge (centred on j = t), and
// with bottom-right causal j <= t + keys - seqlen_q.
int64_t definition_end(const AttentionParams& p, int64_t b, int64_t t) {
  const int64_t keys = p.mask.cache_seqlens != nullptr ? p.mask.cache_seqlens[b] : p.seqlen_k;
  int64_t end = keys;
  if (p.mask.window_right >= 0 && !p.mask.window_follows_causal) {
    end = std::min(end, t + p.mask.window_right + 1);
  }
  if (p.mask.causal_lower_right) end = std::min(end, t + keys - p.seqlen_q + 1);
  return std::max<int64_t>(end, 0);
}

// The first key query t of entry b sees: with a window following bottom-right causal,
// t + keys - seqlen_q - left (at least 0); else 0.
int64_t definition_begin(const AttentionParams& p, int64_t b, int64_t t) {
  if (!p.mask.window_follows_causal || p.mask.window_left < 0) return 0;
  const int64_t keys = p.mask.cache_seqlens != nullptr ? p.mask.cache_seqlens[b] : p.seqlen_k;
  return std::max<int64_t>(0, t + keys - p.seqlen_q - p.mask.window_left);
}

// The definition in fp64: row (b, hq, t) sees keys j < definition_end(b, t) (and keep[b, j],
// when given); a row that sees none has output 0 and lse -inf.
void expect_replay_equals_definition(const Problem& pb, const Replay& replay,
                                     const std::vector<char>* keep = nullptr) {
  const AttentionParams& p = pb.params;
  const int64_t dim = p.head_dim, group = p.heads_q / p.heads_kv;
  const double scale = default_softmax_scale(dim);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t hq = 0; hq < p.heads_q; ++hq) {
      for (int64_t t = 0; t < p.seqlen_q; ++t) {
        const int64_t row = (b * p.heads_q + hq) * p.seqlen_q + t;
        const int64_t end = definition_end(p, b, t), begin = definition_begin(p, b, t);
        std::vector<double> scores(end, -std::numeric_limits<double>::infinity());
        double largest = -std::numeric_limits<double>::infinity();
        for (int64_t j = begin; j < end; ++j) {
          ASSERT_EQ((replay.seen.count({row, j}) ? replay.seen.at({row, j}) : 0), 1)
              << "row " << row << " key " << j << " counted once";
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) {
            dot +=
                pb.q.get(b * p.q_strides.batch + hq * p.q_strides.head + t * p.q_strides.seq + d) *
                pb.k.get(b * p.k_strides.batch + hq / group * p.k_strides.head +
                         j * p.k_strides.seq + d);
          }
          const bool kept = keep == nullptr || (*keep)[b * p.seqlen_k + j];
          scores[j] = kept ? dot * scale : -std::numeric_limits<double>::infinity();
          largest = std::max(largest, scores[j]);
        }
        if (std::isinf(largest)) {  // no key: 0 and -inf
          EXPECT_TRUE(std::isinf(replay.lse[row]) && replay.lse[row] < 0) << "row " << row;
          for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(replay.out[row * dim + d], 0.0);
          continue;
        }
        double sum = 0;
        for (int64_t j = begin; j < end; ++j) sum += std::exp(scores[j] - largest);
        EXPECT_NEAR(replay.lse[row], largest + std::log(sum), 1e-9) << "row " << row;
        for (int64_t d = 0; d < dim; ++d) {
          double value = 0;
          for (int64_t j = begin; j < end; ++j) {
            value += std::exp(scores[j] - largest) / sum *
                     pb.v.get(b * p.v_strides.batch + hq / group * p.v_strides.head +
                              j * p.v_strides.seq + d);
          }
          ASSERT_NEAR(replay.out[row * dim + d], value, 1e-9) << "row " << row << " dim " << d;
        }
      }
    }
  }
  for (const auto& [row_key, times] : replay.seen) {
    const int64_t t = row_key.first % p.seqlen_q, j = row_key.second;
    const int64_t b = row_key.first / (p.heads_q * p.seqlen_q);
    const bool visible = j >= definition_begin(p, b, t) && j < definition_end(p, b, t);
    ASSERT_TRUE(visible) << "row " << row_key.first << " counted hidden key " << j;
  }
}

TEST(DecodePlan, ReplayedBlocksCountEveryVisibleKeyOnceAndEqualTheDefinition) {
  struct ReplayCase {
    const char* name;
    Shape shape;
    bool seq_major;
    int64_t num_splits, window_right;
  };
  const ReplayCase cases[] = {
      {"one_row", {1, 2, 2, 1, 300, 64, 64}, false, 3, -1},
      {"gqa_4_rows_auto", {2, 8, 2, 1, 1000, 64, 64}, true, 0, -1},
      {"drafts_20_rows_lower_right", {1, 8, 2, 5, 777, 64, 64}, true, 4, 772},
      {"rows_48_three_tiles", {1, 16, 2, 6, 200, 64, 64}, false, 2, -1},
      {"rows_64_right_edge", {1, 32, 1, 2, 333, 64, 64}, false, 3, 300},
      {"rows_17", {1, 17, 1, 1, 150, 64, 64}, false, 2, -1},
      {"right_edge_hides_a_chunk", {1, 4, 2, 3, 5000, 64, 64}, false, 8, 62},
      {"right_edge_zero", {1, 2, 1, 4, 300, 64, 64}, false, 2, 0},
      {"keys_fewer_than_a_slice", {1, 4, 2, 1, 5, 64, 64}, false, 0, -1},
      {"many_chunks", {1, 2, 1, 1, 3000, 64, 64}, false, 1000, -1},
  };
  for (const ReplayCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pb(c.shape, DType::kBFloat16, c.seq_major, 17);
    pb.params.mask.window_right = c.window_right;
    pb.params.num_splits = c.num_splits;
    ASSERT_TRUE(detail::decode_kernel_takes(pb.params).ok());
    const KeySplit split = detail::plan_decode(pb.params, 264);
    expect_replay_equals_definition(pb, replay_decode(pb, split));
  }
}

TEST(DecodePlan, ReplayedBlocksWithAKeyMaskEqualTheDefinition) {
  // A padded batch: entry b keeps its first lengths[b] keys (entry 1 none: rows that see no key
  // in any chunk), with and without a right edge; whole chunks hidden by the padding.
  const int64_t lengths[] = {700, 0, 129, 1};
  for (const int64_t right_edge : {int64_t{-1}, int64_t{600}}) {
    SCOPED_TRACE(right_edge);
    Problem pb({4, 8, 2, 3, 1000, 64, 64}, DType::kBFloat16, true, 19);
    pb.params.mask.window_right = right_edge;
    pb.params.num_splits = 6;
    std::vector<char> keep(4 * 1000);
    for (int64_t b = 0; b < 4; ++b) {
      for (int64_t j = 0; j < lengths[b]; ++j) keep[b * 1000 + j] = 1;
    }
    const KeySplit split = detail::plan_decode(pb.params, 264);
    ASSERT_GT(split.parts(), 1);
    expect_replay_equals_definition(pb, replay_decode(pb, split, &keep), &keep);
  }
}

TEST(DecodePlan, ReplayedBlocksWithCacheLengthsAndBottomRightCausalEqualTheDefinition) {
  // Per-entry key lengths (cache_seqlens): an empty entry, one shorter than a slice, one whose
  // keys end inside a chunk and whose later chunks do nothing, one at the full length; with
  // bottom-right causal (new tokens aligned to each entry's own length, entry 3 with fewer
  // keys than queries), a window's right edge, both, and a key mask on top.
  const int32_t lengths[] = {0, 5, 701, 1000, 2};
  struct LengthCase {
    const char* name;
    bool lower_right;
    int64_t window_right, num_splits;
    bool key_mask;
  };
  const LengthCase cases[] = {
      {"lengths", false, -1, 6, false},
      {"lengths_lower_right", true, -1, 6, false},
      {"lengths_lower_right_one_chunk", true, -1, 1, false},
      {"lengths_right_edge", false, 650, 5, false},
      {"lengths_lower_right_and_right_edge", true, 400, 7, false},
      {"lengths_lower_right_key_mask", true, -1, 4, true},
  };
  for (const LengthCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pb({5, 8, 2, 3, 1000, 64, 64}, DType::kBFloat16, true, 23);
    pb.params.mask.cache_seqlens = lengths;
    pb.params.mask.causal_lower_right = c.lower_right;
    pb.params.mask.window_right = c.window_right;
    pb.params.num_splits = c.num_splits;
    ASSERT_TRUE(detail::decode_kernel_takes(pb.params).ok());
    const KeySplit split = detail::plan_decode(pb.params, 264);
    std::vector<char> keep(5 * 1000, 1);
    for (int64_t j = 0; j < 1000; j += 3) keep[2 * 1000 + j] = 0;  // entry 2: every third key
    const std::vector<char>* mask = c.key_mask ? &keep : nullptr;
    expect_replay_equals_definition(pb, replay_decode(pb, split, mask), mask);
  }
}

TEST(DecodePlan, CacheLengthsAreClampedOnTheDevice) {
  // The kernel does not validate cache_seqlens (the per-entry path does, on the host): values
  // outside [0, seqlen_k] are clamped, so no chunk reads past the cache.
  AttentionParams p = decode_call(3, 8, 8, 1, 1000, 4);
  const int32_t lengths[] = {-5, 1000, 70000};
  p.mask.cache_seqlens = lengths;
  const KeySplit split = detail::plan_decode(p, 264);
  const detail::DecodeKernelParams k = detail::make_decode_kernel_params(p, split, {});
  EXPECT_EQ(detail::decode_entry_keys(k, 0), 0);
  EXPECT_EQ(detail::decode_entry_keys(k, 1), 1000);
  EXPECT_EQ(detail::decode_entry_keys(k, 2), 1000);
  for (int64_t c = 0; c < split.parts(); ++c) {
    EXPECT_EQ(detail::decode_chunk(k, c, 0).tiles, 0);
    EXPECT_LE(detail::decode_chunk(k, c, 2).end, 1000);
    EXPECT_GE(detail::decode_chunk(k, c, 2).any_end, 0);
  }
}

// Sliding-window decoding: a left edge following bottom-right causal (window_follows_causal),
// the chunks starting at each entry's first row's window, with cache_seqlens and a key mask.
TEST(DecodePlan, ReplayedBlocksWithASlidingWindowEqualTheDefinition) {
  const int32_t lengths[] = {1000, 300, 5, 0};
  struct WindowCase {
    const char* name;
    int64_t seqlen_q, left, num_splits;
    bool lengths, key_mask;
  };
  const WindowCase cases[] = {
      {"one_query_window_100", 1, 100, 3, false, false},
      {"drafts_window_70", 5, 70, 4, true, false},
      {"drafts_window_0", 3, 0, 2, true, false},
      {"window_past_the_keys", 4, 5000, 6, true, false},
      {"one_chunk_key_mask", 2, 130, 1, true, true},
      {"chunks_key_mask", 3, 700, 4, true, true},
  };
  for (const WindowCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pb({4, 8, 2, c.seqlen_q, 1000, 64, 64}, DType::kBFloat16, true, 29);
    pb.params.mask.causal_lower_right = true;
    pb.params.mask.window_follows_causal = true;
    pb.params.mask.window_left = c.left;
    if (c.lengths) pb.params.mask.cache_seqlens = lengths;
    pb.params.num_splits = c.num_splits;
    ASSERT_TRUE(detail::decode_kernel_takes(pb.params).ok())
        << detail::decode_kernel_takes(pb.params).message();
    const KeySplit split = detail::plan_decode(pb.params, 264);
    std::vector<char> keep(4 * 1000, 1);
    for (int64_t j = 0; j < 1000; j += 4) keep[j] = 0;  // entry 0: every fourth key
    const std::vector<char>* mask = c.key_mask ? &keep : nullptr;
    expect_replay_equals_definition(pb, replay_decode(pb, split, mask), mask);
  }
}

}  // namespace
}  // namespace samattn::testing
