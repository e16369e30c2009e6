// Internal: the fp32 IEEE SGEMM on CUDA cores, warp-tiled.
//
// A block computes a kBlockM x kBlockN tile of C from kBlockK-deep slices of A and B held in
// double-buffered (dynamic) shared memory, both stored k-major (As[k][m], Bs[k][n]) so every
// fragment read is a 16-byte vector along m or n. The block's warps tile it in kWarpM x kWarpN
// pieces; inside a warp each lane owns a kThreadM x kThreadN accumulator tile made of 4 x 4
// sub-tiles spread kWarpM / (kThreadM / 4) rows (and columns) apart, so the lanes of a quarter-warp
// read eight consecutive float4 of A (or one broadcast float4) and never conflict on a bank. Per k
// step a lane loads kThreadM + kThreadN floats and issues kThreadM * kThreadN FFMAs.
//
// Register staging (kStages = 0): the next slice's global loads are issued into registers
// before the current slice's FMAs and stored to the other buffer after them (one barrier per
// slice); kPrefetchAcrossSlices also moves the next slice's first fragment loads ahead of the
// slice's last FMAs. Each operand is walked along its unit (or smaller) stride: with a unit
// stride, aligned addresses and a slice inside the matrix, one float4 load per vector; otherwise
// bounds-checked scalar loads at any strides. k-fast A and k-fast B are transposed on their way
// into shared memory (4 scalar stores per vector; the rows are padded by 4 floats so these
// stores do not conflict).
//
// cp.async ring (kStages >= 2): no registers in between. An mn-fast operand is copied 16 bytes
// at a time where the vector is whole, aligned and inside, else element by element; a k-fast
// operand element by element (4-byte copies land transposed, which a 16-byte copy cannot do).
// Elements outside the matrix are zero-filled (0 source bytes, read from the matrix's base).
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/tensor_core/mma.cuh"
#include "gemm/simt/sgemm_args.h"
#include "gemm/simt/sgemm_async_loader.cuh"
#include "gemm/simt/slice_barrier.cuh"

namespace samattn::detail::simt {

// Loads one vector: a float4 at `ptr` when `fast` (unit stride, aligned, inside), else four
// scalars `fast_stride` apart, zero where the element lies outside the matrix. mn_left and
// k_left count the rows (A) or columns (B) and the k indices left from the vector's first
// element; the vector runs along k when k_fast.
__device__ __forceinline__ float4 load_vector(const float* ptr, bool fast, int64_t fast_stride,
                                              bool k_fast, int mn_left, int64_t k_left) {
  if (fast) return __ldg(reinterpret_cast<const float4*>(ptr));
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const bool inside = k_fast ? (mn_left > 0 && k_left > e) : (mn_left > e && k_left > 0);
    v[e] = inside ? ptr[e * fast_stride] : 0.0f;
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

// Stores a loaded vector into the k-major smem slice tile[k][mn] (row length kLd).
template <int kLd>
__device__ __forceinline__ void store_vector(float* tile, VectorSlot slot, bool k_fast, float4 v) {
  if (k_fast) {
    tile[(slot.k + 0) * kLd + slot.mn] = v.x;
    tile[(slot.k + 1) * kLd + slot.mn] = v.y;
    tile[(slot.k + 2) * kLd + slot.mn] = v.z;
    tile[(slot.k + 3) * kLd + slot.mn] = v.w;
  } else {
    *reinterpret_cast<float4*>(tile + slot.k * kLd + slot.mn) = v;
  }
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    sgemm_kernel(const SgemmArgs args) {
  constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, BK = Cfg::kBlockK;
  extern __shared__ __align__(16) float sgemm_smem[];
  float(*As)[BK][Cfg::kLdA] = reinterpret_cast<float(*)[BK][Cfg::kLdA]>(sgemm_smem);
  float(*Bs)[BK][Cfg::kLdB] =
      reinterpret_cast<float(*)[BK][Cfg::kLdB]>(sgemm_smem + Cfg::kBuffers * BK * Cfg::kLdA);

  const int tid = static_cast<int>(threadIdx.x);
  const int m0 = static_cast<int>(blockIdx.y) * BM;
  const int n0 = static_cast<int>(blockIdx.x) * BN;
  const int64_t batch = blockIdx.z;
  const float* a_block = args.a + batch * args.a_bs + m0 * args.a_rs;
  const float* b_block = args.b + batch * args.b_bs + n0 * args.b_cs;
  const int m_left = args.m - m0, n_left = args.n - n0;
  const bool a_inside = args.a_vec && m_left >= BM;
  const bool b_inside = args.b_vec && n_left >= BN;
  const bool a_k_fast = !args.a_m_fast, b_k_fast = args.b_k_fast;
  const int64_t a_fast_stride = a_k_fast ? args.a_cs : args.a_rs;
  const int64_t b_fast_stride = b_k_fast ? args.b_rs : args.b_cs;

  VectorSlot a_slot[Cfg::kVecsA], b_slot[Cfg::kVecsB];
  const float* a_ptr[Cfg::kVecsA];
  const float* b_ptr[Cfg::kVecsB];
#pragma unroll
  for (int v = 0; v < Cfg::kVecsA; ++v) {
    a_slot[v] = vector_slot<BM, BK>(tid + v * Cfg::kThreads, a_k_fast);
    a_ptr[v] = a_block + a_slot[v].mn * args.a_rs + a_slot[v].k * args.a_cs;
  }
#pragma unroll
  for (int v = 0; v < Cfg::kVecsB; ++v) {
    b_slot[v] = vector_slot<BN, BK>(tid + v * Cfg::kThreads, args.b_k_fast);
    b_ptr[v] = b_block + b_slot[v].mn * args.b_cs + b_slot[v].k * args.b_rs;
  }
  const int64_t a_step = BK * args.a_cs, b_step = BK * args.b_rs;

  float4 ra[Cfg::kVecsA], rb[Cfg::kVecsB];
  // Interior slices of interior blocks take one uniform branch to plain float4 loads, so the
  // bounds arithmetic of the general path stays out of the main loop's common case.
  const bool blocks_inside = a_inside && b_inside;
  auto load_slice = [&](int64_t k0) {
    const bool k_inside = k0 + BK <= args.k;
    if (blocks_inside && k_inside) {
#pragma unroll
      for (int v = 0; v < Cfg::kVecsA; ++v)
        ra[v] = __ldg(reinterpret_cast<const float4*>(a_ptr[v]));
#pragma unroll
      for (int v = 0; v < Cfg::kVecsB; ++v)
        rb[v] = __ldg(reinterpret_cast<const float4*>(b_ptr[v]));
    } else {
#pragma unroll
      for (int v = 0; v < Cfg::kVecsA; ++v) {
        ra[v] = load_vector(a_ptr[v], a_inside && k_inside, a_fast_stride, a_k_fast,
                            m_left - a_slot[v].mn, args.k - k0 - a_slot[v].k);
      }
#pragma unroll
      for (int v = 0; v < Cfg::kVecsB; ++v) {
        rb[v] = load_vector(b_ptr[v], b_inside && k_inside, b_fast_stride, b_k_fast,
                            n_left - b_slot[v].mn, args.k - k0 - b_slot[v].k);
      }
    }
#pragma unroll
    for (int v = 0; v < Cfg::kVecsA; ++v) a_ptr[v] += a_step;
#pragma unroll
    for (int v = 0; v < Cfg::kVecsB; ++v) b_ptr[v] += b_step;
  };
  auto store_slice = [&](int buf) {
#pragma unroll
    for (int v = 0; v < Cfg::kVecsA; ++v) {
      store_vector<Cfg::kLdA>(&As[buf][0][0], a_slot[v], a_k_fast, ra[v]);
    }
#pragma unroll
    for (int v = 0; v < Cfg::kVecsB; ++v) {
      store_vector<Cfg::kLdB>(&Bs[buf][0][0], b_slot[v], b_k_fast, rb[v]);
    }
  };

  // This lane's first sub-tile, within the block.
  const LaneOrigin origin = lane_origin<Cfg>(tid);
  const int row0 = origin.row, col0 = origin.col;

  float acc[Cfg::kThreadM][Cfg::kThreadN];
#pragma unroll
  for (int i = 0; i < Cfg::kThreadM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kThreadN; ++j) acc[i][j] = 0.0f;

  // One k step: the lane's fragments of slice buffer `buf` at k index kk, and its FMAs.
  auto load_fragments = [&](int buf, int kk, float4(&fa)[Cfg::kSubM], float4(&fb)[Cfg::kSubN]) {
#pragma unroll
    for (int i = 0; i < Cfg::kSubM; ++i) {
      fa[i] = *reinterpret_cast<const float4*>(&As[buf][kk][row0 + i * Cfg::kSubStrideM]);
    }
#pragma unroll
    for (int j = 0; j < Cfg::kSubN; ++j) {
      fb[j] = *reinterpret_cast<const float4*>(&Bs[buf][kk][col0 + j * Cfg::kSubStrideN]);
    }
  };
  // The FMAs of sub-tile rows [first_sub_m, end_sub_m) of one k step.
  auto multiply_rows = [&](const float4(&fa)[Cfg::kSubM], const float4(&fb)[Cfg::kSubN],
                           int first_sub_m, int end_sub_m) {
#pragma unroll
    for (int i = first_sub_m; i < end_sub_m; ++i) {
      const float x[4] = {fa[i].x, fa[i].y, fa[i].z, fa[i].w};
#pragma unroll
      for (int j = 0; j < Cfg::kSubN; ++j) {
        const float y[4] = {fb[j].x, fb[j].y, fb[j].z, fb[j].w};
#pragma unroll
        for (int ii = 0; ii < 4; ++ii)
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            acc[4 * i + ii][4 * j + jj] = fmaf(x[ii], y[jj], acc[4 * i + ii][4 * j + jj]);
          }
      }
    }
  };
  auto multiply = [&](const float4(&fa)[Cfg::kSubM], const float4(&fb)[Cfg::kSubN]) {
    multiply_rows(fa, fb, 0, Cfg::kSubM);
  };

  const int64_t slices = (args.k + BK - 1) / BK;
  // Prefetch across slices (kPrefetchAcrossSlices, and every cp.async ring): fragments alternate
  // between two register sets, the set for k step kk + 1 loaded before kk's FMAs. The last k
  // step runs `cross_slices` (the next slice's buffer made ready, then the barrier) and loads the
  // next slice's first fragments from buffer `next` before its own FMAs, so their latency hides
  // behind them.
  float4 fa[2][Cfg::kSubM], fb[2][Cfg::kSubN];
  auto slice_k_steps = [&](int buf, int next, bool has_next, auto cross_slices) {
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      const int cur = kk & 1;
      if (kk + 1 < BK) {
        load_fragments(buf, kk + 1, fa[cur ^ 1], fb[cur ^ 1]);
      } else {
        cross_slices();
        if (has_next) load_fragments(next, 0, fa[cur ^ 1], fb[cur ^ 1]);
      }
      multiply(fa[cur], fb[cur]);
    }
  };
  if constexpr (Cfg::kStages > 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // cp.async needs sm_80: launch_sgemm never runs a staged configuration below it
#else
    constexpr int kStages = Cfg::kStages;
    AsyncOperandLoader<Cfg, BM> a_loader;
    AsyncOperandLoader<Cfg, BN> b_loader;
    a_loader.init(a_block, args.a + batch * args.a_bs, args.a_rs, args.a_cs, a_k_fast, args.a_vec,
                  m_left, tid);
    b_loader.init(b_block, args.b + batch * args.b_bs, args.b_cs, args.b_rs, b_k_fast, args.b_vec,
                  n_left, tid);
    const uint32_t a_tiles = tensor_core::shared_address(&As[0][0][0]);
    const uint32_t b_tiles = tensor_core::shared_address(&Bs[0][0][0]);
    constexpr uint32_t kTileBytesA = BK * Cfg::kLdA * sizeof(float);
    constexpr uint32_t kTileBytesB = BK * Cfg::kLdB * sizeof(float);
    // Slices are copied in order (the loaders step their pointers one slice per call).
    auto copy_slice = [&](int64_t slice, int stage) {
      a_loader.copy(a_tiles + stage * kTileBytesA, slice * BK, args.k);
      b_loader.copy(b_tiles + stage * kTileBytesB, slice * BK, args.k);
    };
    // Slice s lives in stage s % kStages. Iteration s first copies slice s + kStages - 1 into
    // the stage slice s - 1 used (every lane passed the barrier that ended iteration s - 1, so
    // its reads are done); its last k step waits for slice s + 1 (one cp.async group per
    // slice, empty ones included, so the count is the same in every iteration), crosses the
    // barrier, and loads slice s + 1's first fragments before its own FMAs.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < slices) copy_slice(s, s);
      tensor_core::cp_async_commit();
    }
    tensor_core::cp_async_wait<kStages - 2>();
    __syncthreads();
    load_fragments(0, 0, fa[0], fb[0]);
    int read_stage = 0, write_stage = kStages - 1;
    for (int64_t s = 0; s < slices; ++s) {
      if (s + kStages - 1 < slices) copy_slice(s + kStages - 1, write_stage);
      tensor_core::cp_async_commit();
      const int next_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
      slice_k_steps(read_stage, next_stage, s + 1 < slices, [&] {
        tensor_core::cp_async_wait<kStages - 2>();
        __syncthreads();
      });
      write_stage = read_stage;
      read_stage = next_stage;
    }
    tensor_core::cp_async_wait<0>();
#endif
  } else if constexpr (Cfg::kSplitBarrier) {
    // As below, but k step kStoreStep of a slice stores the next slice and arrives, and the
    // last k step runs the first half of its FMAs before it waits for the other threads'
    // stores. Slice s lives in buffer s % kBuffers. A thread storing slice s + 1 has passed the
    // wait that ended slice s - 1, so every thread had arrived in slice s - 1, after its last
    // read of slice s - 2's buffer (a slice's last fragments load one k step early). With two
    // buffers that is the buffer written, so the store must come in the last k step (then its
    // arrival also follows every read of slice s - 1's own buffer); a third buffer lets it come
    // earlier.
    static_assert(Cfg::kSubM % 2 == 0, "the last k step's FMAs split in two halves");
    uint64_t* barrier_storage = reinterpret_cast<uint64_t*>(
        reinterpret_cast<unsigned char*>(sgemm_smem) + Cfg::kSliceBytes);
    const SliceBarrier barrier(barrier_storage);
    if (tid == 0) barrier.init(Cfg::kThreads);
    load_slice(0);
    store_slice(0);
    __syncthreads();
    load_fragments(0, 0, fa[0], fb[0]);
    int buf = 0;
    for (int64_t s = 0; s < slices; ++s) {
      const int next = buf + 1 == Cfg::kBuffers ? 0 : buf + 1;
      const bool has_next = s + 1 < slices;
      if (has_next) load_slice((s + 1) * BK);
      auto store_and_arrive = [&] {
        if (has_next) {
          store_slice(next);
          barrier.arrive();
        }
      };
#pragma unroll
      for (int kk = 0; kk + 1 < BK; ++kk) {
        const int cur = kk & 1;
        if (kk == Cfg::kStoreStep) store_and_arrive();
        load_fragments(buf, kk + 1, fa[cur ^ 1], fb[cur ^ 1]);
        multiply(fa[cur], fb[cur]);
      }
      constexpr int kLast = (BK - 1) & 1;
      if (Cfg::kStoreStep == BK - 1) store_and_arrive();
      multiply_rows(fa[kLast], fb[kLast], 0, Cfg::kSubM / 2);
      if (has_next) {
        barrier.wait(static_cast<uint32_t>(s & 1));
        load_fragments(next, 0, fa[kLast ^ 1], fb[kLast ^ 1]);
      }
      multiply_rows(fa[kLast], fb[kLast], Cfg::kSubM / 2, Cfg::kSubM);
      buf = next;
    }
  } else if constexpr (Cfg::kPrefetchAcrossSlices) {
    load_slice(0);
    store_slice(0);
    __syncthreads();
    load_fragments(0, 0, fa[0], fb[0]);
    for (int64_t s = 0; s < slices; ++s) {
      const int buf = static_cast<int>(s & 1);
      const bool has_next = s + 1 < slices;
      if (has_next) load_slice((s + 1) * BK);
      // The next slice goes into the buffer last read before the previous slice's barrier.
      slice_k_steps(buf, buf ^ 1, has_next, [&] {
        if (has_next) store_slice(buf ^ 1);
        __syncthreads();
      });
    }
  } else {
    load_slice(0);
    store_slice(0);
    __syncthreads();
    for (int64_t s = 0; s < slices; ++s) {
      const int buf = static_cast<int>(s & 1);
      if (s + 1 < slices) load_slice((s + 1) * BK);
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        float4 fa[Cfg::kSubM], fb[Cfg::kSubN];
        load_fragments(buf, kk, fa, fb);
        multiply(fa, fb);
      }
      if (s + 1 < slices) store_slice(buf ^ 1);
      __syncthreads();
    }
  }

  // Epilogue: alpha * acc (+ beta * C, read only when beta != 0); a float4 per sub-tile row
  // where C's columns are contiguous, aligned and inside, else bounds-checked scalars.
  float* c_block = args.c + batch * args.c_bs + m0 * args.c_rs + n0 * args.c_cs;
  const bool read_c = args.beta != 0.0f;
#pragma unroll
  for (int i = 0; i < Cfg::kSubM; ++i) {
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int r = row0 + i * Cfg::kSubStrideM + ii;
      if (r >= m_left) continue;
      float* c_row = c_block + r * args.c_rs;
#pragma unroll
      for (int j = 0; j < Cfg::kSubN; ++j) {
        const int col = col0 + j * Cfg::kSubStrideN;
        float v[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) v[jj] = args.alpha * acc[4 * i + ii][4 * j + jj];
        if (args.c_vec && col + 4 <= n_left) {
          float4* dst = reinterpret_cast<float4*>(c_row + col);
          if (read_c) {
            const float4 old = *dst;
            v[0] = fmaf(args.beta, old.x, v[0]);
            v[1] = fmaf(args.beta, old.y, v[1]);
            v[2] = fmaf(args.beta, old.z, v[2]);
            v[3] = fmaf(args.beta, old.w, v[3]);
          }
          *dst = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            if (col + jj >= n_left) continue;
            float* dst = c_row + (col + jj) * args.c_cs;
            *dst = read_c ? fmaf(args.beta, *dst, v[jj]) : v[jj];
          }
        }
      }
    }
  }
}

}  // namespace samattn::detail::simt
