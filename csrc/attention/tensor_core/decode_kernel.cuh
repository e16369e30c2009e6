// Internal: the decoding kernel (attention/decode.h says what it is for and which calls it
// takes). One block: chunk blockIdx.x of the keys of kv head blockIdx.y, batch entry
// blockIdx.z, against every query row of that kv head (row r is query head
// h * group + r / seqlen_q, query r % seqlen_q).
//
// Warp w computes 16-row mma tile w % tiles (tiles = ceil(rows / 16)) over the 16-key slices
// w / tiles, w / tiles + phases, ... of each 64-key tile (phases = 4 / tiles), with the
// tensor-core forward's warp products and online softmax; a warp with w / tiles >= phases only
// helps load. The warps of one row tile then merge their (max, sum, output) in shared memory.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/decode.h"
#include "attention/tensor_core/mma.cuh"
#include "attention/tensor_core/online_softmax.cuh"
#include "attention/tensor_core/tile_io.cuh"
#include "attention/tensor_core/warp_gemm.cuh"

namespace samattn::tensor_core {

template <int kHeadDim>
struct DecodeConfig {
  static constexpr int kThreads = detail::kDecodeThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockN = detail::kDecodeBlockN;
  static constexpr int kSliceKeys = 16;  // keys of one warp step: one k-step of P V
  static constexpr int kSlices = kBlockN / kSliceKeys;
  static constexpr int kMaxRows = static_cast<int>(detail::kDecodeMaxRows);
  static constexpr int kStride = detail::decode_row_pitch(kHeadDim);  // elements
  static constexpr int kTileElems = kBlockN * kStride;                // one K or V tile
  static constexpr int kChunkElems = 8;                               // 16-bit, 16 bytes
  static constexpr int kChunksPerRow = kHeadDim / kChunkElems;
  // The warps' final states, in floats, over the stages: (warp, 16 rows, pitch) outputs, then
  // (warp, 16 rows) maxima and sums. The pitch keeps float2 stores of a quad's rows apart.
  static constexpr int kStatePitch = kHeadDim + 8;
  static constexpr int kStateFloats = kWarps * 16 * (kStatePitch + 2);

  static_assert(kMaxRows == 16 * kWarps, "every warp owns a row tile when rows fill the block");
  static_assert((kStride * 2 / 16) % 2 == 1, "row pitch must be odd in 16 bytes");
  static_assert(kStateFloats * 4 <= 2 * detail::kDecodeStages * kTileElems * 2,
                "the final states fit over the stages");
  static_assert(detail::decode_tiles_bytes(kHeadDim) ==
                    (kMaxRows + 2 * detail::kDecodeStages * kBlockN) * kStride * 2,
                "tile layout");
  static_assert(detail::decode_tiles_bytes(kHeadDim) % 16 == 0, "the mask terms are float2-read");
};

// Query row r's first element in q (or out): query head h * group + r / queries, query
// r % queries (queries = seqlen_q <= 64: 32-bit division).
__device__ __forceinline__ int64_t decode_row_offset(const detail::DecodeKernelParams& p,
                                                     int64_t head_kv, int row, int queries,
                                                     int64_t head_stride, int64_t row_stride) {
  return (head_kv * p.group + row / queries) * head_stride + (row % queries) * row_stride;
}

// A key mask's entry for (batch entry b, key) as raw bits, converted only when stored, so the
// load stays in flight for an iteration. Validation admits bool, float32 or the inputs' dtype
// (float16, bfloat16 here).
__device__ __forceinline__ uint32_t load_mask_bits(const detail::DecodeKernelParams& p, int64_t b,
                                                   int64_t key) {
  const int64_t offset = b * p.mask_batch_stride + key * p.mask_col_stride;
  switch (p.mask_dtype) {
    case MaskDType::kBool:
      return static_cast<const unsigned char*>(p.mask)[offset];
    case MaskDType::kFloat32:
      return static_cast<const uint32_t*>(p.mask)[offset];
    case MaskDType::kFloat16:
    case MaskDType::kBFloat16:
      return static_cast<const uint16_t*>(p.mask)[offset];
    default:
      return 0;
  }
}

// The additive term of those bits in the log2 domain: 0 or -inf for a boolean mask, value *
// log2(e) for a float one (the other kernels' element_mask_log2).
__device__ __forceinline__ float mask_term_log2(MaskDType dtype, uint32_t bits) {
  switch (dtype) {
    case MaskDType::kBool:
      return bits != 0 ? 0.f : -INFINITY;
    case MaskDType::kFloat32:
      return __uint_as_float(bits) * kLog2e;
    case MaskDType::kFloat16:
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits))) * kLog2e;
    case MaskDType::kBFloat16:
      return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(bits))) * kLog2e;
    default:
      return 0.f;
  }
}

// One masked score: exactly -inf for a key the mask or the structure (already -inf) hides, even
// when its score or its term is NaN or +inf (the reference never looks at hidden keys: a padded
// cache's unwritten rows may hold anything).
__device__ __forceinline__ float masked_score(float score, float term) {
  return term == -INFINITY || score == -INFINITY ? -INFINITY : score + term;
}

// Adds the key-mask terms of a 16-key slice to the warp's scores (the lane's keys
// 2 * (lane % 4) + {0, 1} of each 8-key tile, the same for both of its rows).
__device__ __forceinline__ void add_key_terms(float (&s)[1][2][4], const float* terms, int lane) {
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const float2 pair = *reinterpret_cast<const float2*>(terms + t * 8 + 2 * (lane % 4));
    s[0][t][0] = masked_score(s[0][t][0], pair.x);
    s[0][t][1] = masked_score(s[0][t][1], pair.y);
    s[0][t][2] = masked_score(s[0][t][2], pair.x);
    s[0][t][3] = masked_score(s[0][t][3], pair.y);
  }
}

// A stage of a paged cache: keys [first, first + valid_rows) of entry b (rows past them zeros)
// into the K and V tiles, each row from its own page. The threads split rows and 16-byte chunks
// as load_tile_async does; a row's page is looked up once for its K and V rows.
template <int kHeadDim, int kStride, int kThreads, typename Element>
__device__ __forceinline__ void load_paged_stage(Element* k_tile, Element* v_tile,
                                                 const detail::DecodeKernelParams& p,
                                                 const Element* k_head, const Element* v_head,
                                                 int64_t b, int64_t first, int valid_rows) {
  constexpr int kRows = detail::kDecodeBlockN;
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = kHeadDim / kChunkElems;
  constexpr int kRowStep = kThreads / kChunksPerRow;
  const int thread = static_cast<int>(threadIdx.x);
  if (thread >= kRowStep * kChunksPerRow) return;
  const int col = thread % kChunksPerRow * kChunkElems;
  for (int row = thread / kChunksPerRow; row < kRows; row += kRowStep) {
    const bool valid = row < valid_rows;
    const Element* k_from = k_head;
    const Element* v_from = v_head;
    if (valid) {
      const detail::DecodePagedRow at = detail::decode_paged_row(p, b, first + row);
      k_from = k_head + at.page * p.k_batch_stride + at.row * p.k_row_stride + col;
      v_from = v_head + at.page * p.v_batch_stride + at.row * p.v_row_stride + col;
    }
    cp_async_16(shared_address(k_tile + row * kStride + col), k_from, valid);
    cp_async_16(shared_address(v_tile + row * kStride + col), v_from, valid);
  }
}

// Sets the warp's scores of keys before each row's window (key_start[i], relative to the
// 16-key slice: the lane's keys 2 * (lane % 4) + {0, 1} of each 8-key tile) to -inf.
__device__ __forceinline__ void mask_before(float (&s)[1][2][4], const int (&key_start)[2],
                                            int lane) {
  const int col0 = 2 * (lane % 4);
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (t * 8 + col0 + (e & 1) < key_start[e / 2]) s[0][t][e] = -INFINITY;
    }
  }
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void decode_block(const detail::DecodeKernelParams& p) {
  using Cfg = DecodeConfig<kHeadDim>;
  constexpr int kStride = Cfg::kStride;
  constexpr int kRowBytes = kStride * 2;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kKSteps = kHeadDim * 2 / 32;
  constexpr float kLn2 = 0.6931471805599453f;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_tile = reinterpret_cast<Element*>(shared_bytes);  // (kMaxRows, kStride)
  Element* stages = q_tile + Cfg::kMaxRows * kStride;          // per stage: K tile, V tile

  const int64_t head_kv = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int queries = static_cast<int>(p.seqlen_q);
  const int rows = static_cast<int>(p.group) * queries;
  const detail::DecodeChunk chunk = detail::decode_chunk(p, blockIdx.x, b);
  const int64_t any_end = chunk.any_end;
  const int64_t all_end = chunk.all_end;
  const int64_t n_tiles = chunk.tiles;

  const auto* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride;
  // A paged cache: the head's rows in the pool (each key row's page added when it loads).
  const bool paged = p.block_table != nullptr;
  const auto* k_head = static_cast<const Element*>(p.k) + head_kv * p.k_head_stride;
  const auto* v_head = static_cast<const Element*>(p.v) + head_kv * p.v_head_stride;
  const auto* k = k_head + (paged ? 0 : b * p.k_batch_stride + chunk.begin * p.k_row_stride);
  const auto* v = v_head + (paged ? 0 : b * p.v_batch_stride + chunk.begin * p.v_row_stride);

  // Query rows of the computed 16-row tiles: 16-byte copies with each row's own address; rows
  // past `rows` are zeros.
  const int tile_rows = (rows + 15) / 16 * 16;
  for (int i = static_cast<int>(threadIdx.x); i < tile_rows * Cfg::kChunksPerRow;
       i += Cfg::kThreads) {
    const int row = i / Cfg::kChunksPerRow;
    const int col = i % Cfg::kChunksPerRow * Cfg::kChunkElems;
    const bool valid = row < rows;
    const Element* from =
        valid
            ? q + decode_row_offset(p, head_kv, row, queries, p.q_head_stride, p.q_row_stride) + col
            : q;
    cp_async_16(shared_address(q_tile + row * kStride + col), from, valid);
  }
  const auto load_stage = [&](int64_t tile) {
    Element* k_tile = stages + (tile % detail::kDecodeStages) * 2 * Cfg::kTileElems;
    const int64_t first = tile * kBlockN;
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), any_end - first));
    if (paged) {
      load_paged_stage<kHeadDim, kStride, Cfg::kThreads>(
          k_tile, k_tile + Cfg::kTileElems, p, k_head, v_head, b, chunk.begin + first, keys);
      return;
    }
    load_tile_async<kBlockN, kHeadDim, kStride, Cfg::kThreads>(k_tile, k + first * p.k_row_stride,
                                                               p.k_row_stride, keys);
    load_tile_async<kBlockN, kHeadDim, kStride, Cfg::kThreads>(
        k_tile + Cfg::kTileElems, v + first * p.v_row_stride, p.v_row_stride, keys);
  };
  if (n_tiles > 0) load_stage(0);
  cp_async_commit();

  // A key mask: thread i < kBlockN moves key i of each tile into mask_terms (one tile, written
  // before the barrier that opens the tile; the previous tile's readers passed the one that
  // closed theirs), its load issued an iteration ahead.
  float* mask_terms = reinterpret_cast<float*>(shared_bytes + detail::decode_tiles_bytes(kHeadDim));
  const bool key_mask = p.mask != nullptr;
  const int mask_key = static_cast<int>(threadIdx.x);
  const bool moves_mask = key_mask && mask_key < kBlockN;
  uint32_t mask_bits = 0;
  bool mask_key_exists = false;
  const auto load_mask = [&](int64_t tile) {
    const int64_t key = tile * kBlockN + mask_key;
    mask_key_exists = key < any_end;
    if (mask_key_exists) mask_bits = load_mask_bits(p, b, chunk.begin + key);
  };
  if (moves_mask && n_tiles > 0) load_mask(0);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const detail::DecodeWarpRole role = detail::decode_warp_role(rows, warp, Cfg::kWarps);
  const int row_tiles = role.row_tiles;
  const int phases = role.phases;
  const int row_tile = role.row_tile;
  const int phase = role.phase;
  const bool computes = role.computes();

  // The keys of the chunk the lane's rows row_tile * 16 + lane / 4 (+ 8) see.
  int64_t row_end[2], row_begin[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_end[i] = detail::decode_row_end(p, chunk, row_tile * 16 + lane / 4 + 8 * i, rows);
    row_begin[i] = detail::decode_row_begin(p, chunk, row_tile * 16 + lane / 4 + 8 * i, rows);
  }
  // Slices before the last query's window start need the left edge masked.
  const int64_t left_mask_end = chunk.has_left ? chunk.first_begin + queries - 1 : 0;
  const uint32_t q_lane =
      shared_address(q_tile + row_tile * 16 * kStride + q_lane_offset<Element, kStride>(lane));

  float o[1][kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][t][e] = 0.f;
  }
  OnlineSoftmax<1> softmax;

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) load_stage(tile + 1);
    cp_async_commit();
    if (moves_mask) {
      mask_terms[mask_key] = mask_key_exists ? mask_term_log2(p.mask_dtype, mask_bits) : 0.f;
      if (tile + 1 < n_tiles) load_mask(tile + 1);
    }
    cp_async_wait<1>();  // this tile (and the query rows) landed ...
    __syncthreads();     // ... for every thread
    if (computes) {
      const Element* k_tile = stages + (tile % detail::kDecodeStages) * 2 * Cfg::kTileElems;
      const uint32_t k_lane = shared_address(k_tile + k_lane_offset<Element, kStride>(lane));
      const Element* v_lane = k_tile + Cfg::kTileElems + v_lane_offset<Element, kStride>(lane);
      for (int slice = phase; slice < Cfg::kSlices; slice += phases) {
        const int64_t first = tile * kBlockN + slice * Cfg::kSliceKeys;
        if (first >= any_end) break;
        float s[1][2][4];
        warp_qk<Element, 1, 2, kKSteps, kStride>(s, q_lane, k_lane + slice * 16 * kRowBytes);
        int key_limit[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          key_limit[i] = static_cast<int>(max(int64_t{-1}, min(row_end[i] - first, int64_t{16})));
        }
        scale_and_mask(s, p.scale_log2, first + Cfg::kSliceKeys > all_end, key_limit, lane);
        if (first < left_mask_end) {
          int key_start[2];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            key_start[i] =
                static_cast<int>(max(int64_t{0}, min(row_begin[i] - first, int64_t{16})));
          }
          mask_before(s, key_start, lane);
        }
        if (key_mask) add_key_terms(s, mask_terms + slice * Cfg::kSliceKeys, lane);
        float rescale[2];
        softmax.update(s, rescale);
#pragma unroll
        for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[0][t][e] *= rescale[e / 2];
        }
        warp_pv<Element, 1, 2, kDTiles, kStride>(o, s, v_lane + slice * 16 * kStride);
      }
    }
    __syncthreads();  // nobody reads this stage when the next iteration refills it
  }
  cp_async_wait<0>();  // without tiles, the query copies are still in flight
  __syncthreads();

  // Each computing warp's state over the stages: unnormalised output, row maxima (log2
  // domain, equal over a quad) and sums.
  float* state_out = reinterpret_cast<float*>(stages);
  float* state_max = state_out + Cfg::kWarps * 16 * Cfg::kStatePitch;
  float* state_sum = state_max + Cfg::kWarps * 16;
  if (computes) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = lane / 4 + 8 * i;
      const float sum = quad_sum(softmax.row_sum[i]);
      if (lane % 4 == 0) {
        state_max[warp * 16 + row] = softmax.row_max[i];
        state_sum[warp * 16 + row] = sum;
      }
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        store_pair(state_out + (warp * 16 + row) * Cfg::kStatePitch + t * 8 + 2 * (lane % 4),
                   o[0][t][2 * i], o[0][t][2 * i + 1]);
      }
    }
  }
  __syncthreads();

  // Merge the phases of each row and write two columns per step.
  const int64_t heads_q = p.heads_kv * p.group;
  for (int i = static_cast<int>(threadIdx.x); i < rows * (kHeadDim / 2); i += Cfg::kThreads) {
    const int row = i / (kHeadDim / 2);
    const int col = i % (kHeadDim / 2) * 2;
    const int first_warp = row / 16;
    const int tile_row = row % 16;
    float largest = -INFINITY;
    for (int ph = 0; ph < phases; ++ph) {
      largest = fmaxf(largest, state_max[(first_warp + ph * row_tiles) * 16 + tile_row]);
    }
    // As in the online softmax: a row that saw no key subtracts 0, so its weights stay 0
    // rather than NaN, while a NaN sum still poisons the row.
    const float shift = largest == -INFINITY ? 0.f : largest;
    float total = 0.f, first_value = 0.f, second_value = 0.f;
    for (int ph = 0; ph < phases; ++ph) {
      const int state_row = (first_warp + ph * row_tiles) * 16 + tile_row;
      const float weight = fast_exp2(state_max[state_row] - shift);
      const float* out_row = state_out + state_row * Cfg::kStatePitch + col;
      total += weight * state_sum[state_row];
      first_value += weight * out_row[0];
      second_value += weight * out_row[1];
    }
    const float inverse = total == 0.f ? 0.f : 1.f / total;
    const float lse = total == 0.f ? -INFINITY : (largest + log2f(total)) * kLn2;
    const int64_t head_q = head_kv * p.group + row / queries;
    const int query = row % queries;
    if (p.parts == 1) {
      Element* out = static_cast<Element*>(p.out) + b * p.o_batch_stride +
                     decode_row_offset(p, head_kv, row, queries, p.o_head_stride, p.o_row_stride) +
                     col;
      store_pair(out, first_value * inverse, second_value * inverse);
      if (col == 0 && p.lse != nullptr) p.lse[(b * heads_q + head_q) * queries + query] = lse;
    } else {
      const int64_t part_row =
          int64_t{blockIdx.x} * p.workspace_rows + (b * heads_q + head_q) * queries + query;
      store_pair(p.part_out + part_row * kHeadDim + col, first_value * inverse,
                 second_value * inverse);
      if (col == 0) p.part_lse[part_row] = lse;
    }
  }
}

// sm80+ only (cp.async, bf16 mma); an older build traps instead of silently writing nothing.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(detail::kDecodeThreads)
    decode_kernel(const __grid_constant__ detail::DecodeKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  decode_block<Element, kHeadDim>(p);
#else
  __trap();
#endif
}

}  // namespace samattn::tensor_core
