// Internal: the two warp-level matrix products of the tensor-core forward, on shared-memory
// tiles, for each element type:
//   S = Q K^T   (Q rows of the warp x kBlockN keys, over the head dimension)
//   O += P V    (P straight from the S accumulators)
// fp16/bf16 use mma.m16n8k16; float uses TF32 mma.m16n8k8 with every operand rounded by
// cvt.rna. A k-step of either covers 32 bytes of a row, so Q and K are read with the same
// ldmatrix addresses; only P V differs (ldmatrix.trans cannot split 32-bit elements).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/mma.cuh"

namespace samattn::tensor_core {

template <typename Element>
struct MmaAtom {                           // fp16 and bf16
  static constexpr int kKeysPerStep = 16;  // keys of P V per mma
  __device__ __forceinline__ static uint32_t operand(uint32_t bits) { return bits; }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16<Element>(d, a, b0, b1);
  }
};

template <>
struct MmaAtom<float> {
  static constexpr int kKeysPerStep = 8;
  __device__ __forceinline__ static uint32_t operand(uint32_t bits) {
    return to_tf32(__uint_as_float(bits));
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k8_tf32(d, a, b0, b1);
  }
};

// Element offsets of the lane's ldmatrix rows in the Q and K tiles (row pitch kStride):
//  Q (A, x4): matrices (rows 0-7 | 8-15) x (first | second 16 bytes of the k-step).
//  K (B, x4): keys 0-7 first half, keys 0-7 second half, keys 8-15 first, keys 8-15 second:
//             b0/b1 of two adjacent 8-key tiles.
template <typename Element, int kStride>
__device__ __forceinline__ int q_lane_offset(int lane) {
  return (lane & 15) * kStride + (lane >> 4) * int(16 / sizeof(Element));
}

template <typename Element, int kStride>
__device__ __forceinline__ int k_lane_offset(int lane) {
  return ((lane & 7) + ((lane >> 4) << 3)) * kStride +
         ((lane >> 3) & 1) * int(16 / sizeof(Element));
}

// Element offset of the lane's V reads:
//  16-bit (ldmatrix.x4.trans): keys 0-7 | 8-15 of dims 0-7, then of dims 8-15: b0/b1 of two
//  adjacent 8-dim output tiles.
//  float (scalar loads): key 2 * (lane % 4), dim lane / 4 (see warp_pv).
template <typename Element, int kStride>
__device__ __forceinline__ int v_lane_offset(int lane) {
  if constexpr (sizeof(Element) == 2) return (lane & 15) * kStride + (lane >> 4) * 8;
  return 2 * (lane % 4) * kStride + lane / 4;
}

// s = Q K^T over kKSteps k-steps of 32 bytes; each K fragment feeds every row tile of the warp.
// q_lane / k_lane: shared addresses of the lane's Q and K rows (offsets above).
template <typename Element, int kMTiles, int kNTiles, int kKSteps, int kStride>
__device__ __forceinline__ void warp_qk(float (&s)[kMTiles][kNTiles][4], uint32_t q_lane,
                                        uint32_t k_lane) {
  using Atom = MmaAtom<Element>;
  constexpr int kRowBytes = kStride * int(sizeof(Element));
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[m][t][e] = 0.f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      ldmatrix_x4(a[m], q_lane + m * 16 * kRowBytes + ks * 32);
#pragma unroll
      for (int i = 0; i < 4; ++i) a[m][i] = Atom::operand(a[m][i]);
    }
#pragma unroll
    for (int t = 0; t < kNTiles; t += 2) {
      uint32_t b[4];
      ldmatrix_x4(b, k_lane + t * 8 * kRowBytes + ks * 32);
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = Atom::operand(b[i]);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        Atom::mma(s[m][t], a[m], b[0], b[1]);
        Atom::mma(s[m][t + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// o += P V, where p holds the probabilities in S-accumulator order and v_lane points at the
// lane's V element (v_lane_offset) in shared memory.
template <typename Element, int kMTiles, int kNTiles, int kDTiles, int kStride>
__device__ __forceinline__ void warp_pv(float (&o)[kMTiles][kDTiles][4],
                                        const float (&p)[kMTiles][kNTiles][4],
                                        const Element* v_lane) {
  if constexpr (sizeof(Element) == 2) {
    // The S accumulators of key tiles 2kk and 2kk + 1 are exactly the A fragment of keys
    // [16kk, 16kk + 16) once packed to 16-bit pairs.
    const uint32_t v_address = shared_address(v_lane);
#pragma unroll
    for (int kk = 0; kk < kNTiles / 2; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        a[m][0] = pack<Element>(p[m][2 * kk][0], p[m][2 * kk][1]);
        a[m][1] = pack<Element>(p[m][2 * kk][2], p[m][2 * kk][3]);
        a[m][2] = pack<Element>(p[m][2 * kk + 1][0], p[m][2 * kk + 1][1]);
        a[m][3] = pack<Element>(p[m][2 * kk + 1][2], p[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int t = 0; t < kDTiles; t += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_address + (kk * 16 * kStride + t * 8) * int(sizeof(Element)));
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          mma_m16n8k16<Element>(o[m][t], a[m], b[0], b[1]);
          mma_m16n8k16<Element>(o[m][t + 1], a[m], b[2], b[3]);
        }
      }
    }
  } else {
    // The sum over keys does not care about their order, so the A fragment's k-index j of key
    // tile kk stands for key 2j (j < 4) or 2(j - 4) + 1: the lane's own accumulators c0..c3
    // become a0 = c0, a2 = c1, a1 = c2, a3 = c3 without shuffles, and V's rows are read in the
    // same order (b0 from key 2t, b1 from key 2t + 1; with a row pitch of 4 mod 16 words the
    // rows 2t start 8 banks apart, so a warp's 32 loads hit 32 banks).
#pragma unroll
    for (int kk = 0; kk < kNTiles; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        a[m][0] = to_tf32(p[m][kk][0]);
        a[m][1] = to_tf32(p[m][kk][2]);
        a[m][2] = to_tf32(p[m][kk][1]);
        a[m][3] = to_tf32(p[m][kk][3]);
      }
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        const float* v = v_lane + kk * 8 * kStride + t * 8;
        const uint32_t b0 = to_tf32(v[0]);
        const uint32_t b1 = to_tf32(v[kStride]);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) mma_m16n8k8_tf32(o[m][t], a[m], b0, b1);
      }
    }
  }
}

}  // namespace samattn::tensor_core
