// Host-side check of the fragment assumptions of csrc/attention/hopper/backward_kernel.cuh, on
// the kernel's own CuTe types (no GPU needed; CuTe layouts evaluate on the host):
//  - every accumulator element pair (2i, 2i + 1) of S^T, dQ and dK/dV is two adjacent columns of
//    one row (the kernel packs them into one 32-bit store / one 8-byte reduction);
//  - element i of an S^T or dK/dV fragment is in the row of element 0 or 2 as (i / 2) % 2 says
//    (the mask; the dK/dV stores' two row pointers);
//  - each consumer warpgroup owns keys [64 w, 64 w + 64) of S^T and dK/dV; the warpgroup that
//    computes a step's dQ owns all of it (the split variant: warpgroup w owns the rows
//    [64 w, 64 w + 64) (128-row steps) or the columns [w D / 2, (w + 1) D / 2) (64-row steps));
//    the column split (head dims 192 and 256): each warpgroup computes all of S^T (its thread t
//    as thread t of a one-warpgroup tile) and owns columns [w D / 2, (w + 1) D / 2) of dK/dV and
//    dQ, whose value quads it adds to 16-byte-aligned, contiguous chunk floats;
//  - where the kernel stages a dQ value (Traits::dq_chunk_float) is backward_config.h's chunk
//    layout (dq_chunk_offset below) of the value's (row, column), and backward_dq_slot_position
//    (what the conversion kernel reads back with) inverts it, each quad of slots covering 8
//    consecutive columns;
//  - where it stages the value in its warpgroup's staging tile (Traits::dq_staging_float) lies
//    inside that tile, once, at the chunk's place within the fragment;
//  - the address where a thread stores dS^T(key, query) (its S^T partition of the dS^T view) is
//    the address the dQ wgmma reads as dS(query, key), query pairs adjacent, in every buffer;
//  - the fragments cover every tile element exactly once.
// Build and run (from the repository root):
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//     -I csrc/include -I csrc -isystem $CUTLASS_INCLUDE -isystem $(dirname $(which
//     nvcc))/../include/cccl \ tests/emulation/hopper_backward_fragments.cu -o
//     /tmp/hopper_backward_fragments
//   /tmp/hopper_backward_fragments      -> "OK", exit 0
// ($CUTLASS_INCLUDE: the nvidia-cutlass wheel's source/include, as csrc/CMakeLists.txt finds it.)
// tests/python/test_hopper_backward_fragments.py builds and runs it in the test suite.
#include <cstdio>
#include <set>

#include "attention/hopper/backward_kernel.cuh"

using namespace cute;
using namespace samattn::hopper::bwd;

// The chunk layout of backward_config.h written out as a map: where dQ(row, col) of a block lies
// in its chunk, in floats (the kernel's store order and backward_dq_slot_position are checked
// against it).
long dq_chunk_offset(int head_dim, int row, int col) {
  using namespace samattn::hopper;
  const int cols = backward_dq_fragment_cols(head_dim);
  const bool split_rows = backward_dq_split_rows(head_dim);
  const int fragment = split_rows ? row / kDqFragmentRows : col / cols;
  const int r = row % kDqFragmentRows, c = col % cols;
  const int slot = r / 16 * backward_dq_warp_slots(head_dim) + c / 8 * 32 + r % 8 * 4 + c % 8 / 2;
  return long{fragment} * backward_dq_fragment_floats(head_dim) + slot * 4 + r / 8 % 2 * 2 + c % 2;
}

template <typename Element, int kHeadDim, bool kAlternateDq>
int check() {
  using T = Traits<Element, kHeadDim, kAlternateDq>;
  constexpr int kBlockM = T::kBlockM;
  int bad = 0;
  const auto report = [&](const char* what, int tid, int i) {
    if (bad++ < 10) {
      printf("D=%d M=%d: %s (thread %d, element %d)\n", kHeadDim, kBlockM, what, tid, i);
    }
  };
  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmaDKV mma_dkv;
  typename T::TiledMmaDQ mma_dq;
  const auto sdp_tile = Shape<typename T::BlockN, typename T::BlockM>{};
  const auto dkv_tile = Shape<typename T::BlockN, typename T::HeadDim>{};
  const auto dq_tile = Shape<typename T::BlockM, typename T::HeadDim>{};
  // Swizzles act on address bits: evaluate the layouts through a 1024-byte-aligned pointer.
  Element* base = reinterpret_cast<Element*>(0x10000);
  Tensor sdS = make_tensor(make_smem_ptr(base), typename T::SmemLayoutDs{});
  Tensor sdSt = make_tensor(make_smem_ptr(base), typename T::SmemLayoutDst{});
  const auto offset = [&](auto&& element) { return long(raw_pointer_cast(&element) - base); };
  std::set<int> sdp_seen, dq_seen, dkv_seen;
  std::set<long> ds_seen, chunk_seen;
  std::set<int> staging_seen[2];  // per warpgroup of the dQ thread
  for (int tid = 0; tid < 256; ++tid) {
    const int warpgroup = tid / 128;
    auto thr_sdp = mma_sdp.get_thread_slice(T::kColumnSplit ? tid % 128 : tid);
    Tensor c = thr_sdp.partition_C(make_identity_tensor(sdp_tile));
    Tensor stores = thr_sdp.partition_C(sdSt);
    for (int i = 0; i < size(c); ++i) {
      const int key = get<0>(c(i)), query = get<1>(c(i));
      sdp_seen.insert(key * T::kBlockM + query);
      if (!T::kColumnSplit && key / 64 != warpgroup) {
        report("S^T row outside the warpgroup's keys", tid, i);
      }
      if (get<0>(c((i / 2) % 2 == 0 ? 0 : 2)) != key) report("row-half rule", tid, i);
      if (i % 2 == 1 && (get<0>(c(i - 1)) != key || get<1>(c(i - 1)) != query - 1)) {
        report("S^T pair not adjacent", tid, i);
      }
      for (int buffer = 0; buffer < T::kDsBuffers; ++buffer) {
        Tensor dst = stores(_, _, _, buffer);
        const long at = offset(dst(i));
        if (at != offset(sdS(query, key, buffer))) report("dS^T store != dS read", tid, i);
        if (i % 2 == 1 && at != offset(dst(i - 1)) + 1) report("dS^T pair not adjacent", tid, i);
        if (buffer == 0) ds_seen.insert(at);
      }
    }
    // dQ's threads: one warpgroup's 128 (either consumer warpgroup, by turns), or the split's 256.
    if (tid < int(size(mma_dq))) {
      Tensor cq = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(dq_tile));
      if (size(cq) != T::kBlockM * kHeadDim / int(size(mma_dq))) {
        report("dQ fragment size", tid, -1);
      }
      for (int i = 0; i < size(cq); ++i) {
        const int row = get<0>(cq(i)), col = get<1>(cq(i));
        dq_seen.insert(row * kHeadDim + col);
        const int owner = T::kDqWarpgroupsM == 2 ? row / 64 : col / (kHeadDim / 2);
        if (!kAlternateDq && owner != warpgroup) {
          report("dQ element outside the warpgroup's half", tid, i);
        }
        const long staged = T::dq_chunk_float(tid, i);
        if (staged != dq_chunk_offset(kHeadDim, row, col)) {
          report("staged dQ order != chunk offset", tid, i);
        }
        chunk_seen.insert(staged);
        // The staging tile holds only the fragments of the thread's warpgroup, each value once
        // (the column split has none: it adds dQ from registers at dq_chunk_float).
        const int in_staging = T::dq_staging_float(tid, i);
        if (T::kColumnSplit) {
          if (i % 4 == 0 && staged % 4 != 0) report("dQ quad not 16-byte aligned", tid, i);
          if (i % 4 != 0 && staged != T::dq_chunk_float(tid, i - 1) + 1) {
            report("dQ quad not contiguous", tid, i);
          }
        } else if (in_staging < 0 || in_staging >= T::kDqStagingFloats ||
                   !staging_seen[tid / 128].insert(in_staging).second ||
                   in_staging % T::kDqFragmentFloats != staged % T::kDqFragmentFloats) {
          report("staged dQ outside its warpgroup's tile or twice", tid, i);
        }
        if (i % 2 == 1 && (get<0>(cq(i - 1)) != row || get<1>(cq(i - 1)) != col - 1)) {
          report("dQ pair not adjacent", tid, i);
        }
      }
    }
    Tensor ck = mma_dkv.get_thread_slice(tid).partition_C(make_identity_tensor(dkv_tile));
    for (int i = 0; i < size(ck); ++i) {
      const int row = get<0>(ck(i)), col = get<1>(ck(i));
      dkv_seen.insert(row * kHeadDim + col);
      const int owner = T::kColumnSplit ? col / (kHeadDim / 2) : row / 64;
      if (owner != warpgroup) report("dK/dV element outside the warpgroup's part", tid, i);
      if (get<0>(ck((i / 2) % 2 == 0 ? 0 : 2)) != row) report("dK/dV row-half rule", tid, i);
      if (i % 2 == 1 && (get<0>(ck(i - 1)) != row || get<1>(ck(i - 1)) != col - 1)) {
        report("dK/dV pair not adjacent", tid, i);
      }
    }
  }
  if (int(sdp_seen.size()) != T::kBlockN * T::kBlockM) report("S^T coverage", -1, -1);
  if (int(ds_seen.size()) != T::kBlockN * T::kBlockM) report("dS store coverage", -1, -1);
  if (int(dq_seen.size()) != T::kBlockM * kHeadDim) report("dQ coverage", -1, -1);
  if (int(chunk_seen.size()) != T::kBlockM * kHeadDim ||
      *chunk_seen.rbegin() != kBlockM * kHeadDim - 1) {
    report("staged dQ chunk coverage", -1, -1);
  }
  for (int slot = 0; slot < kBlockM * kHeadDim / 4; ++slot) {
    const auto at = samattn::hopper::backward_dq_slot_position(kHeadDim, slot);
    const long expect[4] = {dq_chunk_offset(kHeadDim, at.row, at.col),
                            dq_chunk_offset(kHeadDim, at.row, at.col + 1),
                            dq_chunk_offset(kHeadDim, at.row + 8, at.col),
                            dq_chunk_offset(kHeadDim, at.row + 8, at.col + 1)};
    for (int e = 0; e < 4; ++e) {
      if (expect[e] != 4L * slot + e) report("dQ slot position does not invert", slot, e);
    }
    // The conversion kernel's quads: slot 4u + e holds columns col + 2e of the quad's rows.
    const auto first = samattn::hopper::backward_dq_slot_position(kHeadDim, slot / 4 * 4);
    if (first.col % 8 != 0 || at.row != first.row || at.col != first.col + 2 * (slot % 4)) {
      report("dQ slot quad is not 8 consecutive columns", slot, -1);
    }
  }
  if (int(dkv_seen.size()) != T::kBlockN * kHeadDim) report("dK/dV coverage", -1, -1);
  printf("%s D=%d M=%d %s: %d problems, shared memory %d bytes\n",
         cute::is_same_v<Element, cutlass::half_t> ? "fp16" : "bf16", kHeadDim, kBlockM,
         T::kColumnSplit ? "column split"
         : kAlternateDq  ? "alternating dQ"
                         : "split dQ",
         bad, T::kSmemBytes);
  return bad;
}

int main() {
  // Both dQ schedules at head dims 64 and 128 (the shipped ones per backward_alternates_dq for
  // both dtypes; the others for bf16, as tuning builds instantiate them); one at the others.
  using samattn::hopper::backward_alternates_dq;
  const int bad =
      check<cutlass::bfloat16_t, 64, true>() + check<cutlass::bfloat16_t, 64, false>() +
      check<cutlass::bfloat16_t, 128, true>() + check<cutlass::bfloat16_t, 128, false>() +
      check<cutlass::bfloat16_t, 96, backward_alternates_dq(96)>() +
      check<cutlass::half_t, 96, backward_alternates_dq(96)>() +
      check<cutlass::bfloat16_t, 192, false>() + check<cutlass::bfloat16_t, 256, false>() +
      check<cutlass::half_t, 64, backward_alternates_dq(64)>() +
      check<cutlass::half_t, 128, backward_alternates_dq(128)>() +
      check<cutlass::half_t, 192, backward_alternates_dq(192)>() +
      check<cutlass::half_t, 256, backward_alternates_dq(256)>();
  printf("%s\n", bad == 0 ? "OK" : "FAIL");
  return bad == 0 ? 0 : 1;
}
