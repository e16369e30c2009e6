// CPU tests of the GEMM kernels' index functions (no GPU): the sm80 kernel's shared-memory
// tiles replayed store by store and fragment by fragment against the mma fragment layouts,
// with the bank-group rules the swizzles promise; and the SGEMM's loader and lane tiling.
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gemm/simt/sgemm_args.h"
#include "gemm/sm80/tile_layout.h"

namespace samattn::testing {
namespace {

using namespace detail::sm80;

// The id stored for element (mn, k) of a tile: distinct, nonzero, fits 16 bits.
uint32_t element_id(int mn, int k) { return static_cast<uint32_t>(mn * 64 + k + 1); }

// One operand tile filled by replaying every loader thread's chunks, as the cp.async copies
// would place them.
template <int kElemBytes>
struct ReplayedTile {
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;
  static constexpr int kBlockK = kKBytes / kElemBytes;
  bool mn_major;
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kTileBytes, 0);

  explicit ReplayedTile(bool mn_major_) : mn_major(mn_major_) {
    std::vector<int> writes(kTileBytes, 0);
    std::set<std::pair<int, int>> elements;
    for (int tid = 0; tid < kLoaderThreads; ++tid) {
      const LoaderChunk first = loader_chunk<kElemBytes>(mn_major, tid, 0);
      const int first_offset = tile_offset<kElemBytes>(mn_major, first.row, first.chunk);
      for (int i = 0; i < kChunksPerThread; ++i) {
        const LoaderChunk c = loader_chunk<kElemBytes>(mn_major, tid, i);
        const int offset = tile_offset<kElemBytes>(mn_major, c.row, c.chunk);
        // The loader places chunk i at first_offset + i * kTileBytes / 2.
        EXPECT_EQ(offset, first_offset + i * kTileBytes / kChunksPerThread) << "tid " << tid;
        for (int e = 0; e < kChunkElems; ++e) {
          const int mn = c.mn + (mn_major ? e : 0), k = c.k + (mn_major ? 0 : e);
          EXPECT_TRUE(mn < kTileMN && k < kBlockK) << "mn " << mn << " k " << k;
          elements.insert({mn, k});
          const uint32_t id = element_id(mn, k);
          std::memcpy(&bytes[offset + e * kElemBytes], &id, kElemBytes);
          for (int b = 0; b < kElemBytes; ++b) ++writes[offset + e * kElemBytes + b];
        }
      }
    }
    for (int b = 0; b < kTileBytes; ++b) EXPECT_EQ(writes[b], 1) << "byte " << b;
    EXPECT_EQ(elements.size(), size_t{kTileMN * kBlockK});
  }

  uint32_t read(int offset, int size) const {
    uint32_t v = 0;
    std::memcpy(&v, &bytes[offset], size);
    return v;
  }
};

// Distinct 16-byte bank groups (or the very same address) among one phase's addresses.
::testing::AssertionResult conflict_free_16(const std::vector<int>& offsets) {
  std::set<int> groups, addresses;
  for (int o : offsets) {
    if (addresses.insert(o / kChunkBytes).second && !groups.insert(o / kChunkBytes % 8).second) {
      return ::testing::AssertionFailure() << "two chunks share bank group " << o / 16 % 8;
    }
  }
  return ::testing::AssertionSuccess();
}

template <int kElemBytes>
void check_sm80_tile(bool mn_major) {
  SCOPED_TRACE(std::string(kElemBytes == 2 ? "16-bit" : "tf32") +
               (mn_major ? " mn-major" : " k-major"));
  const ReplayedTile<kElemBytes> tile(mn_major);
  // cp.async stores: each quarter-warp's 8 chunks in distinct bank groups.
  for (int tid0 = 0; tid0 < kLoaderThreads; tid0 += 8) {
    for (int i = 0; i < kChunksPerThread; ++i) {
      std::vector<int> offsets;
      for (int tid = tid0; tid < tid0 + 8; ++tid) {
        const LoaderChunk c = loader_chunk<kElemBytes>(mn_major, tid, i);
        offsets.push_back(tile_offset<kElemBytes>(mn_major, c.row, c.chunk));
      }
      EXPECT_TRUE(conflict_free_16(offsets)) << "store, threads " << tid0 << "..";
    }
  }
  // Fragment reads of the kernel's warp tiles: A (origins 0, 64; four 16-row blocks) and B
  // (origins 0, 32, 64, 96; two 16-column blocks), both k steps of a slice.
  constexpr int kKSteps = kKBytes / kMmaKBytes;
  constexpr int kMmaK = kMmaKBytes / kElemBytes;
  const bool ldmatrix = kElemBytes == 2 || !mn_major;
  for (const auto& [origins, blocks] : {std::pair<std::vector<int>, int>{{0, 64}, 4},
                                        std::pair<std::vector<int>, int>{{0, 32, 64, 96}, 2}}) {
    for (int origin : origins) {
      for (int kk = 0; kk < kKSteps; ++kk) {
        for (int block = 0; block < blocks; ++block) {
          const int mn0 = origin + 16 * block;
          int lane_offset[32];
          for (int lane = 0; lane < 32; ++lane) {
            const uint32_t block0 = fragment_offset<kElemBytes>(mn_major, origin, kk, lane);
            lane_offset[lane] = static_cast<int>(block_offset<kElemBytes>(block0, mn_major, block));
            ASSERT_EQ(lane_offset[lane], fragment_offset<kElemBytes>(mn_major, mn0, kk, lane))
                << "block_offset, origin " << origin << " block " << block << " lane " << lane;
          }
          for (int q = 0; q < 4; ++q) {
            if (ldmatrix) {
              const std::vector<int> rows(lane_offset + 8 * q, lane_offset + 8 * q + 8);
              EXPECT_TRUE(conflict_free_16(rows)) << "ldmatrix, mn0 " << mn0 << " q " << q;
            } else {
              std::set<int> banks, words;
              for (int lane = 0; lane < 32; ++lane) {
                const int o = static_cast<int>(tf32_register_offset(lane_offset[lane], q));
                if (words.insert(o / 4).second) {
                  EXPECT_TRUE(banks.insert(o / 4 % 32).second)
                      << "32-bit read bank conflict, mn0 " << mn0 << " q " << q;
                }
              }
            }
            for (int lane = 0; lane < 32; ++lane) {
              const int g = lane / 4, t = lane % 4;
              const int mn = mn0 + (q & 1) * 8 + g;
              uint32_t got = 0, want = 0;
              if (!ldmatrix) {
                got = tile.read(static_cast<int>(tf32_register_offset(lane_offset[lane], q)), 4);
                want = element_id(mn, kk * kMmaK + (q >> 1) * 4 + t);
              } else {
                // ldmatrix: matrix q's row r lives at lane 8q + r's address; lane t receives
                // b16 (t / 4, 2 (t % 4) + h) of it, or (2 (t % 4) + h, t / 4) transposed.
                uint32_t halves[2];
                for (int h = 0; h < 2; ++h) {
                  const int row = mn_major ? 2 * t + h : g, col = mn_major ? g : 2 * t + h;
                  halves[h] = tile.read(lane_offset[8 * q + row] + 2 * col, 2);
                }
                got = halves[0] | (halves[1] << 16);
                if (kElemBytes == 2) {
                  const int k = kk * kMmaK + (q >> 1) * 8 + 2 * t;
                  want = element_id(mn, k) | (element_id(mn, k + 1) << 16);
                } else {
                  want = element_id(mn, kk * kMmaK + (q >> 1) * 4 + t);
                }
              }
              ASSERT_EQ(got, want)
                  << "mn0 " << mn0 << " kk " << kk << " q " << q << " lane " << lane;
            }
          }
        }
      }
    }
  }
}

TEST(GemmSm80Layout, Fp16KMajor) { check_sm80_tile<2>(false); }
TEST(GemmSm80Layout, Fp16MnMajor) { check_sm80_tile<2>(true); }
TEST(GemmSm80Layout, Tf32KMajor) { check_sm80_tile<4>(false); }
TEST(GemmSm80Layout, Tf32MnMajor) { check_sm80_tile<4>(true); }

// ---- SGEMM ------------------------------------------------------------------------------------

template <typename Cfg>
void check_sgemm_config() {
  using namespace detail::simt;
  // Loader: each slice element loaded by exactly one (thread, vector, element), both walks.
  for (const bool k_fast : {false, true}) {
    for (const int mn_extent : {Cfg::kBlockM, Cfg::kBlockN}) {
      std::vector<int> count(mn_extent * Cfg::kBlockK, 0);
      const int vectors = mn_extent * Cfg::kBlockK / 4;
      for (int index = 0; index < vectors; ++index) {
        const VectorSlot s = mn_extent == Cfg::kBlockM
                                 ? vector_slot<Cfg::kBlockM, Cfg::kBlockK>(index, k_fast)
                                 : vector_slot<Cfg::kBlockN, Cfg::kBlockK>(index, k_fast);
        for (int e = 0; e < 4; ++e) {
          const int mn = s.mn + (k_fast ? 0 : e), k = s.k + (k_fast ? e : 0);
          ASSERT_TRUE(mn < mn_extent && k < Cfg::kBlockK);
          ++count[mn * Cfg::kBlockK + k];
        }
      }
      for (int c : count) ASSERT_EQ(c, 1);
    }
  }
  // cp.async ring: each element of a k-fast slice copied by exactly one (thread, element).
  if constexpr (Cfg::kStages > 0) {
    for (const int mn_extent : {Cfg::kBlockM, Cfg::kBlockN}) {
      std::vector<int> count(mn_extent * Cfg::kBlockK, 0);
      for (int tid = 0; tid < Cfg::kThreads; ++tid) {
        for (int e = 0; e < mn_extent / Cfg::kElemRows; ++e) {
          const VectorSlot s = element_slot<Cfg>(tid, e);
          ASSERT_TRUE(s.mn < mn_extent && s.k < Cfg::kBlockK);
          ++count[s.mn * Cfg::kBlockK + s.k];
        }
      }
      for (int c : count) ASSERT_EQ(c, 1);
    }
  }
  // Lanes: every element of the block tile owned by exactly one lane; each quarter-warp's
  // fragment reads (one float4 per sub-tile) conflict-free.
  std::vector<int> owner(Cfg::kBlockM * Cfg::kBlockN, 0);
  for (int tid = 0; tid < Cfg::kThreads; ++tid) {
    const LaneOrigin o = lane_origin<Cfg>(tid);
    for (int i = 0; i < Cfg::kSubM; ++i)
      for (int j = 0; j < Cfg::kSubN; ++j)
        for (int ii = 0; ii < 4; ++ii)
          for (int jj = 0; jj < 4; ++jj) {
            const int r = o.row + i * Cfg::kSubStrideM + ii, c = o.col + j * Cfg::kSubStrideN + jj;
            ASSERT_TRUE(r < Cfg::kBlockM && c < Cfg::kBlockN);
            ++owner[r * Cfg::kBlockN + c];
          }
  }
  for (int c : owner) ASSERT_EQ(c, 1);
  for (int tid0 = 0; tid0 < Cfg::kThreads; tid0 += 8) {
    for (int i = 0; i < Cfg::kSubM || i < Cfg::kSubN; ++i) {
      std::vector<int> a, b;
      for (int tid = tid0; tid < tid0 + 8; ++tid) {
        const LaneOrigin o = lane_origin<Cfg>(tid);
        if (i < Cfg::kSubM) a.push_back(4 * (o.row + i * Cfg::kSubStrideM));
        if (i < Cfg::kSubN) b.push_back(4 * (o.col + i * Cfg::kSubStrideN));
      }
      EXPECT_TRUE(conflict_free_16(a)) << "A fragment, threads " << tid0 << "..";
      EXPECT_TRUE(conflict_free_16(b)) << "B fragment, threads " << tid0 << "..";
    }
  }
}

TEST(GemmSgemmLayout, EveryConfigCoversItsTiles) {
  using namespace detail::simt;
  check_sgemm_config<Sgemm128x128x8>();
  check_sgemm_config<Sgemm128x128x8Lane8x16Pf>();
  check_sgemm_config<Sgemm128x256x8>();
  check_sgemm_config<Sgemm128x256x8Pf>();
  check_sgemm_config<Sgemm128x256x16Pf>();
  check_sgemm_config<Sgemm128x256x16Warps16>();
  check_sgemm_config<Sgemm256x128x8Pf>();
  check_sgemm_config<Sgemm128x256x8PfSplit>();
  check_sgemm_config<Sgemm128x256x8PfSplitStore5>();
  check_sgemm_config<Sgemm128x256x8PfSplitStore3>();
  check_sgemm_config<Sgemm128x256x16PfSplit>();
  check_sgemm_config<Sgemm256x128x8PfSplit>();
  check_sgemm_config<Sgemm128x256x8Stages4>();
  check_sgemm_config<Sgemm128x256x16Stages3>();
  check_sgemm_config<Sgemm128x128x8Stages4>();
  check_sgemm_config<Sgemm128x128x16Stages3>();
  check_sgemm_config<Sgemm128x128x8Lane8x16Stages4>();
}

}  // namespace
}  // namespace samattn::testing
