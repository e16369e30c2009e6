// CPU tests of the sm80 GEMM's global loads (no GPU): every loader thread of every block tile
// replayed k tile by k tile over operands laid out as the GPU tests lay them, with the operand
// arguments the dispatch builds. Each read must stay on the operand's own elements (a cp.async
// reads all 16 bytes of its chunk, so a chunk that only starts inside the operand must not be
// one: M = N = K = 1 in TF32 was such a read past the end of a 4-byte allocation), cp.async
// sources must be 16-byte aligned, and each block must read each element of its rows exactly once.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gemm/sm80/gemm_sm80.h"
#include "gemm/sm80/operand_walk.h"

namespace samattn::testing {
namespace {

using namespace detail::sm80;

// An operand of batch x mn x k elements at element strides, allocated tightly (its last
// element ends the allocation, as for a contiguous tensor).
struct OperandLayout {
  std::string name;
  int64_t mn, k, batch, mn_stride, k_stride, batch_stride;
};

void PrintTo(const OperandLayout& l, std::ostream* os) { *os << l.name; }

int64_t element_offset(const OperandLayout& l, int64_t b, int64_t mn, int64_t k) {
  return b * l.batch_stride + mn * l.mn_stride + k * l.k_stride;
}

template <typename Bits>
void check_loads(const OperandLayout& l) {
  SCOPED_TRACE(l.name + ", " + std::to_string(sizeof(Bits)) + "-byte elements");
  using Walk = OperandWalk<Bits>;
  const int64_t span = element_offset(l, l.batch - 1, l.mn - 1, l.k - 1) + 1;
  // A 16-byte aligned base (the dispatch's cp.async rule assumes an aligned allocation).
  std::vector<uint8_t> storage(span * sizeof(Bits) + kChunkBytes);
  const uintptr_t raw = reinterpret_cast<uintptr_t>(storage.data());
  const Bits* base =
      reinterpret_cast<const Bits*>((raw + kChunkBytes - 1) / kChunkBytes * kChunkBytes);
  const OperandArgs op = make_operand(base, l.mn, l.k, l.mn_stride, l.k_stride, l.batch,
                                      l.batch_stride, static_cast<int>(sizeof(Bits)));
  const int64_t fast_stride = op.mn_major ? op.mn_stride : op.k_stride;
  const int k_tiles = static_cast<int>((l.k + Walk::kBlockK - 1) / Walk::kBlockK);
  int async_chunks = 0;
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int mn0 = 0; mn0 < l.mn; mn0 += kTileMN) {
      std::vector<int> reads(span, 0);
      auto read = [&](const Bits* p, int tid, int kt) {
        const int64_t offset = p - base;
        ASSERT_TRUE(offset >= 0 && offset < span)
            << "tid " << tid << " k tile " << kt << " reads element " << offset << " of " << span;
        ++reads[offset];
      };
      for (int tid = 0; tid < kLoaderThreads; ++tid) {
        Walk walk;
        walk.init(op, b, mn0, static_cast<int>(l.mn), static_cast<int>(l.k), tid);
        for (int kt = 0; kt < k_tiles; ++kt) {
          for (int i = 0; i < kChunksPerThread; ++i) {
            const int valid = walk.valid(i);
            ASSERT_TRUE(valid >= 0 && valid <= Walk::kChunkElems);
            const ChunkCopy copy = chunk_copy(op.async, valid, Walk::kChunkElems);
            if (copy == ChunkCopy::kFullAsync) {
              ++async_chunks;
              ASSERT_EQ(fast_stride, 1);
              ASSERT_EQ((walk.ptr[i] - base) * sizeof(Bits) % kChunkBytes, 0u)
                  << "misaligned cp.async, tid " << tid;
              for (int e = 0; e < Walk::kChunkElems; ++e) read(walk.ptr[i] + e, tid, kt);
            } else if (copy == ChunkCopy::kElements) {
              for (int e = 0; e < valid; ++e) read(walk.ptr[i] + e * fast_stride, tid, kt);
            } else {
              ASSERT_EQ(valid, 0);
            }
            if (::testing::Test::HasFatalFailure()) return;  // a failed read: stop at the first
          }
          walk.advance(op);
        }
      }
      // Exactly the block's rows, each element once; nothing between or after them.
      std::vector<int> expected(span, 0);
      for (int64_t mn = mn0; mn < std::min<int64_t>(mn0 + kTileMN, l.mn); ++mn)
        for (int64_t k = 0; k < l.k; ++k) ++expected[element_offset(l, b, mn, k)];
      for (int64_t e = 0; e < span; ++e) {
        ASSERT_EQ(reads[e], expected[e]) << "element " << e << ", batch " << b << ", block " << mn0;
      }
    }
  }
  // Whole chunks along the walk go by cp.async where the operand allows it.
  if (op.async && (op.mn_major ? l.mn : l.k) >= Walk::kChunkElems) EXPECT_GT(async_chunks, 0);
}

// The layouts of the GPU tests' sm80 cases (tests/cpp/test_gemm_gpu.cpp): A as mn x k with
// row stride k (+ pad), transposed as k x mn; B likewise.
std::vector<OperandLayout> layouts() {
  return {
      {"all1", 1, 1, 1, 1, 1, 1},
      {"all7", 7, 7, 1, 7, 1, 49},
      {"mn_tail_aligned_mn_major_a", 129, 77, 1, 1, 136, 0},
      {"mn_tail_aligned_mn_major_b", 257, 77, 1, 1, 264, 0},
      {"k_tail_aligned_k_major", 264, 1001, 1, 1008, 1, 0},
      {"k5_k_major", 130, 5, 1, 8, 1, 0},
      {"k_major_k1", 129, 1, 1, 1, 1, 0},
      {"mn_major_mn1", 1, 129, 1, 1, 1, 0},
      {"ragged_padded_odd", 129, 1000, 1, 1003, 1, 0},
      {"ragged_trans", 7, 1000, 1, 1, 7, 0},
      {"aligned_batched", 256, 200, 3, 200, 1, 256 * 200},
      {"ragged_batched_mn_major", 129, 100, 3, 1, 132, 132 * 100 + 4},
  };
}

class GemmSm80Loads : public ::testing::TestWithParam<OperandLayout> {};

TEST_P(GemmSm80Loads, SixteenBitReadsStayOnTheOperand) { check_loads<uint16_t>(GetParam()); }

TEST_P(GemmSm80Loads, Tf32ReadsStayOnTheOperand) { check_loads<uint32_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, GemmSm80Loads, ::testing::ValuesIn(layouts()),
                         [](const ::testing::TestParamInfo<OperandLayout>& info) {
                           return info.param.name;
                         });

TEST(GemmSm80LoadRule, PartialChunksNeverUseCpAsync) {
  for (int valid = 0; valid <= 8; ++valid) {
    const ChunkCopy copy = chunk_copy(true, valid, 8);
    if (valid == 0) EXPECT_EQ(copy, ChunkCopy::kZeroFill);
    if (valid == 8) EXPECT_EQ(copy, ChunkCopy::kFullAsync);
    if (valid > 0 && valid < 8) EXPECT_EQ(copy, ChunkCopy::kElements) << valid;
    EXPECT_EQ(chunk_copy(false, valid, 8), ChunkCopy::kElements);
  }
}

}  // namespace
}  // namespace samattn::testing
