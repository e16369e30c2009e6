// Internal: the Hopper (sm_90a) attention backward for fp16/bf16 (dK, dV and the atomic dQ), on
// wgmma and TMA, written with CuTe (from the nvidia-cutlass headers) as a library. D = rowsum(dO
// * O) comes from the SIMT preprocess kernel; the fp32 dQ accumulator is scaled and rounded by
// backward_dq_convert.cuh's kernel (or, deterministic, dQ comes from the tensor-core backward's
// atomic-free dQ kernel and this kernel computes only dK and dV).
//
// One block owns kBlockN = 128 keys of one (batch, kv head) with three warpgroups (above head dim
// 128, 64 keys shared by both consumers: backward_column_split.cuh):
//  - warpgroup 0, the producer, gives most of its registers away (setmaxnreg). One thread issues
//    the TMA copies: K and V of the block once, then Q and dO tiles of each step into a
//    kStages-deep ring of shared-memory stages. One warp stages the step's lse (times log2 e)
//    and D in shared memory. Per stage, the `full` mbarrier completes when the TMA bytes have
//    landed and the 32 statistics threads have arrived; `empty` when all 256 consumer threads
//    are done with the stage.
//  - warpgroups 1 and 2, the consumers, own 64 keys each (the wgmma M). A step is one block of
//    kBlockM (backward_block_m: 128 at head_dim 64, 64 at 128) query rows of one query head of the
//    group (causal: only blocks that see a key of the block). With keys as the M dimension nothing
//    is transposed in registers:
//      S^T = K Q^T and dP^T = V dO^T            (wgmma, both operands from shared memory)
//      P^T = exp2(S^T scale log2 e - lse log2 e), masked; dS^T = P^T (dP^T - D)
//      P^T, dS^T rounded to 16 bits; dS^T -> shared memory
//      dV += P^T dO                             (wgmma, A = P^T from registers)
//      dK += dS^T Q                             (wgmma, A = dS^T from registers)
//      dQ = dS K                                (wgmma over the block's 128 keys, both operands
//                                                from shared memory)
//    dQ contracts over both warpgroups' keys, so it needs both halves of dS. The warpgroups take
//    turns: on even steps warpgroup 1 (the second consumer) computes the whole step's dQ once
//    warpgroup 0 has arrived at the step's named barrier (arrive does not wait), on odd steps the
//    other way round; the one that only arrives goes straight on to the next step's S^T and dP^T,
//    so one warpgroup's softmax runs while the other's GEMMs keep the tensor cores busy (with
//    both meeting every step their softmax phases coincided and the tensor cores idled). The dQ
//    warpgroup stores dQ to shared memory in the chunk's order and each of its warps' first lane
//    adds its slots into the fp32 accumulator with bulk reduce-adds (backward_config.h's chunk
//    layout). kAlternateDq = false: both compute half of dQ, after meeting at a barrier every
//    step, or, at 64 query rows a step (kDeferDq), half of the previous step's dQ after the
//    current step's softmax, so that the warpgroups need not meet (backward_config.h:
//    backward_alternates_dq and backward_defers_dq pick the schedule per head dim).
//    dK and dV stay in registers across all steps (the group's heads are summed there: no
//    atomics) and are rounded and stored once at the end.
//
// Ordering (the places where two agents touch the same shared memory or registers):
//  - Q / dO / lse / D of stage s: written by TMA (async proxy) and by the statistics warp after
//    both waited on empty[s], whose phase completes when every consumer thread arrived after its
//    wgmma.wait_group 0 of the step that used the stage (the tensor cores are done reading);
//    read by the consumers after full[s] completes (TMA complete_tx plus the 32 arrivals, which
//    release the statistics warp's stores; the mbarrier wait acquires them).
//  - dS buffer (step & 1; the deferred schedule below has its own rule): written with ordinary
//    st.shared by the consumers; each thread then runs fence.proxy.async (its generic writes become
//    visible to the async proxy) before it arrives at (or syncs on) the step's named barrier, and
//    only after the barrier is the dQ wgmma (async proxy) issued that reads it. The buffer is
//    written again two steps later. The dQ warpgroup of step s writes it then after its own
//    wgmma.wait_group 0 of step s; the other warpgroup computes dQ at step s + 1 and so passes that
//    step's barrier, which needs the dQ warpgroup of step s to arrive, which it does only after its
//    wait_group 0 of step s. (The split schedule: both pass every barrier, and reach the next one
//    only after the wait_group 1 that covers their dQ wgmma.) The barriers of consecutive steps
//    have different ids, so an arrival for step s + 1 can never complete the barrier of step s.
//  - dS ring of the deferred split schedule (kDeferDq: four buffers, step s in s % 4): warpgroup
//    w writes its half of dS(s), fences, and arrives at ds_ready(w, s) without waiting; the
//    other warpgroup syncs on it in its step s + 1, just before it issues dQ(s), and waits for
//    that wgmma in the same step. Reuse: w writes buffer s % 4 again at step s + 4, after its
//    step s + 3 synced on the other's arrival for step s + 2, which the other makes only after
//    finishing its step s + 1, the one that read dS(s). Barrier ids: w's arrival for step s + 4
//    (the same id as for s) comes after w synced on the other's arrival for s + 2, which the
//    other makes after its step s + 1 synced on ds_ready(w, s). Warpgroup 1 syncs on
//    ds_ready(0, 0) before its first step and not again. At step 0 both issue a dQ wgmma on
//    buffer 3 (no step has written it yet; by the reuse rule its first writer, at step 3, waits
//    for both step 0s) and discard the result: a dQ wgmma issued under a step-dependent
//    condition makes ptxas serialize every wgmma of the loop (C7515).
//  - dQ staging tiles (one per consumer warpgroup; 4 KB of each warp per 64 x 64 fragment): a
//    warp's slots are written only by its own lanes (ordinary st.shared, after the step's dQ
//    wgmma has landed) and read only by the bulk reduce-adds its first lane issues after every
//    lane ran fence.proxy.async and the warp met at __syncwarp. Before the warp writes them
//    again, that lane waits for its bulk reads to finish (cp.async.bulk.wait_group.read 0) and
//    the warp meets again; it waits for the reductions' completion before the block exits.
//  - Register operands (the A fragments P^T and dS^T, every accumulator) belong to the tensor
//    cores from the wgmma issue until the wgmma.wait_group that covers it: dS^T is stored to
//    shared memory before any wgmma takes it, and every register fragment of a step is declared
//    inside the step, after the previous step's wait_group 0.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>

#include "attention/backward_kernel_params.h"
#include "attention/hopper/backward_config.h"
#include "attention/hopper/backward_wgmma.cuh"
#include "attention/hopper/tma_copy.cuh"

namespace samattn::hopper::bwd {

inline constexpr float kLog2e = 1.4426950408889634f;
// The named barrier (CUTLASS numbers user barriers after its reserved ones) where the consumers
// meet once the step's dS is in shared memory.
inline constexpr uint32_t kDsReadyBarrier = 0;
// The deferred schedule's ds_ready ids repeat every kDsReadyCycle steps per warpgroup: an arrival
// for step s + 4 comes only after the other warpgroup has synced on the one for step s
// ("Ordering"), so four suffice; both warpgroups' ids must fit in the user barriers.
inline constexpr int kDsReadyCycle = 4;
static_assert(kDsReadyBarrier + 2 * kDsReadyCycle <=
                  cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers -
                      cutlass::arch::NamedBarrier::ReservedNamedBarrierCount,
              "the ds_ready ids exceed the named barriers left to user code");

// kAlternateDq: one warpgroup computes a step's whole dQ, the two taking turns; false: both
// compute half of it after meeting at a barrier (backward_config.h says which one each head dim
// runs). dK and dV leave through shared memory by TMA store: stop 32 measured it at 0.91-0.94 of
// the time of 4-byte stores from registers at S = 1k (the epilogue's 64 scalar stores of each
// per thread were 4.1% of the stall samples at S = 4k, stop 30's ncu; at S = 1k a block has a
// quarter of the steps to hide them behind).
template <typename Element_, int kHeadDim_, bool kAlternateDq_>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  using Cfg = BackwardConfig;
  static constexpr int kBlockM = backward_block_m(kHeadDim);
  static constexpr bool kAlternateDq = kAlternateDq_;
  // Both consumer warpgroups on the same keys, each with half the columns (backward_config.h);
  // consume_column_split runs it.
  static constexpr bool kColumnSplit = backward_splits_columns(kHeadDim);
  static_assert(!kColumnSplit || !kAlternateDq, "the column split computes dQ in both halves");
  static constexpr int kBlockN = backward_block_n(kHeadDim);
  static constexpr int kStages = Cfg::kStages;
  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;
  using Stages = cute::Int<kStages>;
  // The split schedule at 64 query rows issues each step's dQ one step late (backward_config.h).
  static constexpr bool kDeferDq = backward_defers_dq(kHeadDim, kAlternateDq);
  static constexpr int kDsBuffers = backward_ds_buffers(kHeadDim, kDeferDq);
  using DsBuffers = cute::Int<kDsBuffers>;
  static constexpr int kDqStagingFloats = backward_dq_staging_floats(kHeadDim, kAlternateDq);
  static_assert(kBlockN == 64 * (kColumnSplit ? 1 : Cfg::kConsumerWarpgroups),
                "a consumer warpgroup owns 64 keys");
  static_assert(kBlockM == 64 || kBlockM == 128, "dQ is split by rows (128) or columns (64)");
  // The warpgroups computing one step's dQ, and their split of it: the split schedule divides it
  // over both, by 64-row halves when there are 128 query rows, else by column halves.
  static constexpr int kDqWarpgroups = kAlternateDq ? 1 : Cfg::kConsumerWarpgroups;
  static constexpr int kDqWarpgroupsM = kAlternateDq ? 1 : kBlockM / 64;
  static constexpr int kDqWarpgroupsN = kDqWarpgroups / kDqWarpgroupsM;
  static_assert(kHeadDim % (16 * kDqWarpgroupsN) == 0, "dQ's column split is whole wgmma tiles");
  using DqWarpgroupN = cute::Int<kHeadDim / kDqWarpgroupsN>;
  // The 64-row fragments (backward_config.h) of the step's dQ, and those a dQ warpgroup stages
  // and reduces (the column split stages none: a fragment may hold both warpgroups' columns).
  static constexpr int kDqFragmentCols = backward_dq_fragment_cols(kHeadDim);
  static constexpr int kDqFragmentFloats = backward_dq_fragment_floats(kHeadDim);
  static constexpr int kDqWarpSlots = backward_dq_warp_slots(kHeadDim);
  static constexpr int kDqFragments = kBlockM * kHeadDim / kDqFragmentFloats;
  static constexpr int kDqFragmentsPerThread = kColumnSplit ? 0 : kDqFragments / kDqWarpgroups;
  static_assert(kDqFragments * kDqFragmentFloats == kBlockM * kHeadDim &&
                    (kColumnSplit || kDqFragmentsPerThread * kDqWarpgroups == kDqFragments),
                "a step's dQ is whole fragments, the same number for each dQ warpgroup");
  static_assert(kColumnSplit || kDqFragmentsPerThread * kDqFragmentFloats == kDqStagingFloats,
                "a dQ warpgroup's staging tile holds exactly its fragments");

  // The consumer warpgroups stack along M (keys) for the S^T, dP^T, dK and dV products; dQ = dS K
  // splits as kDqWarpgroupsM x kDqWarpgroupsN. The column split: each warpgroup computes the
  // whole S^T and dP^T (a one-warpgroup tile) and the warpgroups lie along N (columns) for dK and
  // dV, as for dQ.
  using AlongM = cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>;
  using AlongN = cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>;
  using OneWarpgroup = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>;
  using SdpWarpgroups = cute::conditional_t<kColumnSplit, OneWarpgroup, AlongM>;
  using DkvWarpgroups = cute::conditional_t<kColumnSplit, AlongN, AlongM>;
  // Columns of dK and dV per warpgroup.
  using DkvN = cute::Int<kHeadDim / (kColumnSplit ? Cfg::kConsumerWarpgroups : 1)>;
  using DqSplit =
      cute::Layout<cute::Shape<cute::Int<kDqWarpgroupsM>, cute::Int<kDqWarpgroupsN>, cute::_1>>;

  // Where value i of a dQ thread's fragment lies in the block's chunk (backward_config.h), in
  // floats; dq_thread is the thread's index in the dQ warpgroups (0..127 when one warpgroup
  // computes dQ, 0..255 for the split). A thread's values 4g .. 4g + 3 lie in its 8-column
  // group g, so values f P .. (f + 1) P - 1 (P = kDqFragmentFloats / 128) are the thread's
  // warpgroup's fragment f (the split: of the warpgroup's own fragments), in fragment order:
  // value 4j + e of lane l at float4 slot j * 32 + l of the warp's kDqWarpSlots.
  // The column split: the warpgroup's 8-column groups continue the other's (its values
  // 4g .. 4g + 3 are group first + g), and a 64-column fragment may hold both's (head dim 192).
  static constexpr int64_t dq_chunk_float(int dq_thread, int i) {
    constexpr int kPerFragment = kDqFragmentFloats / 128;
    constexpr int kGroups = kDqFragmentCols / 8;  // 8-column groups of a fragment
    const int own_first = kAlternateDq ? 0 : dq_thread / 128 * kDqFragmentsPerThread;
    const int group = dq_thread / 128 * (DqWarpgroupN::value / 8) + i / 4;
    const int fragment = kColumnSplit ? group / kGroups : own_first + i / kPerFragment;
    const int j = kColumnSplit ? group % kGroups : i % kPerFragment / 4;
    const int warp = dq_thread % 128 / 32, lane = dq_thread % 32;
    return int64_t{fragment} * kDqFragmentFloats + (warp * kDqWarpSlots + j * 32 + lane) * 4 +
           i % 4;
  }
  // The same value's place in the thread's warpgroup's staging tile, which holds only the
  // fragments that warpgroup computes (both, or in the split schedule its own).
  static constexpr int dq_staging_float(int dq_thread, int i) {
    const int64_t own_fragments =
        kAlternateDq ? 0 : dq_thread / 128 * kDqFragmentsPerThread * kDqFragmentFloats;
    return static_cast<int>(dq_chunk_float(dq_thread, i) - own_fragments);
  }
  // S^T = K Q^T and dP^T = V dO^T: (key, query), contraction over the head dim (K-major both).
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, BlockM, HeadDim>>(),
      SdpWarpgroups{}));
  // dV += P^T dO and dK += dS^T Q: (key, dim), contraction over the step's queries; A from
  // registers, B = dO^T / Q^T seen as (dim, query) with dim contiguous: MN-major.
  using TiledMmaDKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, DkvN, BlockM>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      DkvWarpgroups{}));
  // dQ = dS K: (query, dim), contraction over the block's keys. A = dS stored query-contiguous,
  // B = K^T seen as (dim, key) with dim contiguous: both MN-major, both from shared memory. One
  // warpgroup tiles the 128 query rows at head_dim 64 with two 64-row atoms.
  using TiledMmaDQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, DqWarpgroupN, BlockN>,
                                 cute::GMMA::Major::MN, cute::GMMA::Major::MN>(),
      DqSplit{}));
  static_assert(cute::size(TiledMmaDQ{}) == 128 * kDqWarpgroups, "dQ's warpgroups");

  // The widest swizzle whose atom divides a warpgroup's columns of the MN-major views below (128
  // B; 64 B at head dims 96 and 192, whose warpgroups take 96 columns: three 32-element atoms).
  using SmemAtomKV =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockN, DkvN>());
  using SmemLayoutKV = decltype(cute::tile_to_shape(SmemAtomKV{}, cute::Shape<BlockN, HeadDim>{}));
  // The same bytes as (dim, key): K^T, the B operand of dQ = dS K.
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_ordered_layout(cute::Shape<HeadDim, BlockN>{}, cute::Step<cute::_2, cute::_1>{})));
  using SmemAtomQ =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockM, DkvN>());
  // Q and dO stages (query, dim, stage) and the same bytes as (dim, query, stage).
  using SmemLayoutQ =
      decltype(cute::tile_to_shape(SmemAtomQ{}, cute::Shape<BlockM, HeadDim, Stages>{}));
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockM, Stages>{},
                                               cute::Step<cute::_2, cute::_1, cute::_3>{})));
  // dS (query, key, buffer), queries contiguous, and the same bytes as dS^T (key, query, buffer):
  // the S^T accumulators' element pairs (adjacent queries) are then adjacent 16-bit values.
  using SmemAtomDs =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::MN, Element,
                                                                   BlockM, BlockN>());
  using SmemLayoutDs =
      decltype(cute::tile_to_shape(SmemAtomDs{}, cute::Shape<BlockM, BlockN, DsBuffers>{}));
  using SmemLayoutDst = decltype(cute::composition(
      SmemLayoutDs{}, cute::make_ordered_layout(cute::Shape<BlockN, BlockM, DsBuffers>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDs>, 1024> ds;
    // Per consumer warpgroup, the dQ it computed last in the chunk's order (dq_chunk_float), read
    // by the bulk reductions. A warp writes and reduces only its own slots of its warpgroup's
    // tile, so reusing them needs nothing beyond the warp's own bulk-read wait.
    cute::array_aligned<float, kDqStagingFloats, 128> dq[Cfg::kConsumerWarpgroups];
    float lse_log2[kStages][kBlockM];  // lse * log2(e) of the step's rows; +inf past seqlen_q
    float delta[kStages][kBlockM];     // D of the step's rows; 0 past seqlen_q
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
    cutlass::arch::ClusterTransactionBarrier full[kStages];
    cutlass::arch::ClusterBarrier empty[kStages];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSmemBytes <= backward_smem_bytes(kHeadDim, sizeof(Element)),
                "backward_config.h must bound the kernel's shared memory");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  template <typename SmemLayout, typename Tile>
  using Tma = TmaCopy<cute::SM90_TMA_LOAD, const Element, SmemLayout, Tile>;
  using TmaQ = Tma<decltype(cute::take<0, 2>(SmemLayoutQ{})), cute::Shape<BlockM, HeadDim>>;
  using TmaKV = Tma<SmemLayoutKV, cute::Shape<BlockN, HeadDim>>;

  // Each consumer warp stages its 16 key rows of dV, then of dK (the column split: of its
  // warpgroup's columns), in the same place of V's tile (a warpgroup's own 64 rows of V are read
  // only by its own dP^T GEMMs, all done by then; the column split's warpgroups meet first) and
  // stores them by TMA. Rows 16 j .. 16 j + 15 of the tile have the layout of rows 0 .. 15 (the
  // swizzle atoms stack along the rows first, and 16 rows are whole 1024-byte swizzle periods),
  // and so have columns D / 2 .. D - 1 that of 0 .. D / 2 - 1 (whole atom columns), so one
  // descriptor serves every warp.
  using StoreRows = cute::_16;
  using StoreTile = cute::Shape<StoreRows, DkvN>;
  using SmemLayoutStore = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(StoreTile{}, cute::Stride<cute::_1, BlockN>{})));
  using TmaStore = TmaCopy<cute::SM90_TMA_STORE, Element, SmemLayoutStore, StoreTile>;
};

template <typename T>
struct KernelParams {
  detail::BackwardKernelParams p;
  GmemShape shape_q;  // q and dout
  GmemShape shape_k;  // k and v
  typename T::TmaQ tma_q;
  typename T::TmaQ tma_dout;
  typename T::TmaKV tma_k;
  typename T::TmaKV tma_v;
  typename T::TmaStore store_dk;  // dK and dV: over the kept keys, as k and v
  typename T::TmaStore store_dv;
};

// The block's work: its keys and the steps (query head, query block of kBlockM rows) that see them.
template <int kBlockM, int kBlockN>
struct BlockWork {
  int64_t b, h_kv, n_begin;
  int64_t m_first;   // first query block of each head (causal: the first that sees key n_begin)
  int64_t per_head;  // query blocks per head
  int64_t steps;     // group_size * per_head

  __device__ __forceinline__ BlockWork(const detail::BackwardKernelParams& p) {
    const detail::ForwardKernelParams& f = p.fwd;
    // Blocks of one (batch, kv head) are adjacent and start with key block 0, which under causal
    // masking sees the most queries, so the longest blocks start first.
    const int64_t n_blocks = (f.kept_keys + kBlockN - 1) / kBlockN;
    const int64_t block = blockIdx.x;
    n_begin = block % n_blocks * kBlockN;
    b = block / n_blocks / p.heads_kv;
    h_kv = block / n_blocks % p.heads_kv;
    const int64_t m_blocks = (f.seqlen_q + kBlockM - 1) / kBlockM;
    // Under causal masking key n is first seen by query n * kv_stride.
    m_first = f.causal ? min(n_begin * f.kv_stride / kBlockM, m_blocks) : 0;
    per_head = m_blocks - m_first;
    steps = f.group_size * per_head;
  }
  // The steps' (query head, query block) in order: step s is head h_kv * group_size +
  // s / per_head, query block m_first + s % per_head, walked by a cursor rather than a 64-bit
  // division per step (4.8% of the stall samples under ncu, stop 30). 32-bit, as TMA's
  // coordinates are: the producer and statistics warps run on 24 registers.
  struct Cursor {
    int32_t h, m_block;
    __device__ __forceinline__ void next(const BlockWork& work) {
      if (++m_block == static_cast<int32_t>(work.m_first + work.per_head)) {
        m_block = static_cast<int32_t>(work.m_first);
        ++h;
      }
    }
  };
  __device__ __forceinline__ Cursor first_step(const detail::BackwardKernelParams& p) const {
    return {static_cast<int32_t>(h_kv * p.fwd.group_size), static_cast<int32_t>(m_first)};
  }
};

// The TMA thread: K and V once, then Q and dO of every step.
template <typename T>
__device__ __forceinline__ void load_tiles(const KernelParams<T>& params,
                                           typename T::SharedStorage& shared,
                                           const BlockWork<T::kBlockM, T::kBlockN>& work) {
  using namespace cute;
  using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
  if (work.steps == 0) return;  // no query sees these keys: nothing to load (dK = dV = 0)
  Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);
  Tensor mdO = params.tma_dout.get_tma_tensor(params.shape_q);
  Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);
  Tensor mV = params.tma_v.get_tma_tensor(params.shape_k);
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(shared.dout.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutKV{});

  const int n_block = static_cast<int>(work.n_begin / T::kBlockN);
  const auto kv_tile = Shape<typename T::BlockN, typename T::HeadDim>{};
  Tensor gK = local_tile(mK(_, _, work.h_kv, work.b), kv_tile, make_coord(n_block, _0{}));
  Tensor gV = local_tile(mV(_, _, work.h_kv, work.b), kv_tile, make_coord(n_block, _0{}));
  auto [tKgK, tKsK] =
      tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
  shared.barrier_kv.arrive_and_expect_tx(2 * T::kKVBytes);
  auto& kv_barrier = reinterpret_cast<BarrierType&>(shared.barrier_kv);
  copy(params.tma_k.with(kv_barrier, 0), tKgK, tKsK);
  copy(params.tma_v.with(kv_barrier, 0), tVgV, tVsV);

  const auto q_tile = Shape<typename T::BlockM, typename T::HeadDim>{};
  auto cursor = work.first_step(params.p);
  for (int64_t step = 0; step < work.steps; ++step) {
    const int stage = static_cast<int>(step % T::kStages);
    const uint32_t phase = static_cast<uint32_t>(step / T::kStages) & 1u;
    shared.empty[stage].wait(phase ^ 1u);  // a fresh barrier's "previous phase" counts as done
    const int64_t h = cursor.h;
    const int m_block = cursor.m_block;
    cursor.next(work);
    Tensor gQ = local_tile(mQ(_, _, h, work.b), q_tile, make_coord(m_block, _0{}));
    Tensor gdO = local_tile(mdO(_, _, h, work.b), q_tile, make_coord(m_block, _0{}));
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(gQ));
    auto [tdOgdO, tdOsdO] = tma_partition(params.tma_dout, _0{}, Layout<_1>{},
                                          group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
    shared.full[stage].arrive_and_expect_tx(2 * T::kQBytes);
    auto& full = reinterpret_cast<BarrierType&>(shared.full[stage]);
    copy(params.tma_q.with(full, 0), tQgQ, tQsQ(_, stage));
    copy(params.tma_dout.with(full, 0), tdOgdO, tdOsdO(_, stage));
  }
}

// The statistics warp: lse * log2(e) and D of every step's rows into the stage's arrays. Rows
// past seqlen_q get lse = +inf and D = 0, so their P (and dS) is exactly 0: TMA zero-fills their
// Q and dO rows, S = 0 and exp2(0 - inf) = 0.
template <typename T>
__device__ __forceinline__ void load_row_statistics(const detail::BackwardKernelParams& p,
                                                    typename T::SharedStorage& shared,
                                                    const BlockWork<T::kBlockM, T::kBlockN>& work,
                                                    int lane) {
  const detail::ForwardKernelParams& f = p.fwd;
  const float* lse_all = static_cast<const float*>(f.lse);
  const float* delta_all = static_cast<const float*>(p.delta);
  auto cursor = work.first_step(p);
  for (int64_t step = 0; step < work.steps; ++step) {
    const int stage = static_cast<int>(step % T::kStages);
    const uint32_t phase = static_cast<uint32_t>(step / T::kStages) & 1u;
    shared.empty[stage].wait(phase ^ 1u);
    const int64_t h = cursor.h;
    const int64_t m_begin = int64_t{cursor.m_block} * T::kBlockM;
    cursor.next(work);
    const float* lse = lse_all + work.b * f.lse_batch_stride + h * f.lse_head_stride;
    const float* delta = delta_all + (work.b * f.heads_q + h) * f.seqlen_q;
    for (int r = lane; r < T::kBlockM; r += BackwardConfig::kStatsThreads) {
      const int64_t m = m_begin + r;
      const bool real = m < f.seqlen_q;
      shared.lse_log2[stage][r] = real ? lse[m] * kLog2e : INFINITY;
      shared.delta[stage][r] = real ? delta[m] : 0.f;
    }
    shared.full[stage].arrive();  // release: the stores above are seen after the full wait
  }
}

// Before a warp writes its staging slots again: its first lane waits until the bulk reductions
// it issued have read them, and the warp meets.
__device__ __forceinline__ void wait_staging_read(bool issues_dq) {
  if (issues_dq) bulk_wait_read_all();
  __syncwarp();
}

// Stores a dQ thread's fragment into its warpgroup's staging tile in the chunk's order
// (Traits::dq_chunk_float): a value quad is one 16-byte store, a warp's 512 contiguous bytes.
template <typename T, typename Fragment>
__device__ __forceinline__ void stage_dq(const Fragment& dq, float* staging, int dq_thread) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(dq); i += 4) {
    *reinterpret_cast<float4*>(staging + T::dq_staging_float(dq_thread, i)) =
        make_float4(dq(i), dq(i + 1), dq(i + 2), dq(i + 3));
  }
}

// Adds a dQ thread's staged fragments into the accumulator chunk `chunk`: every lane makes its
// staging stores visible to the async proxy, the warp meets, and its first lane issues one bulk
// reduce-add per fragment of the warp's slots.
template <typename T>
__device__ __forceinline__ void reduce_staged_dq(float* chunk, const float* staging, int dq_thread,
                                                 bool issues_dq) {
  cutlass::arch::fence_view_async_shared();
  __syncwarp();
  if (!issues_dq) return;
  CUTE_UNROLL
  for (int fragment = 0; fragment < T::kDqFragmentsPerThread; ++fragment) {
    const int first = fragment * T::kDqFragmentFloats / 128;
    bulk_reduce_add(chunk + T::dq_chunk_float(dq_thread, first),
                    staging + T::dq_staging_float(dq_thread, first),
                    T::kDqWarpSlots * sizeof(float4));
  }
}

// dV, then dK times the softmax scale, of the warp's 16 key rows, each rounded to the element
// type, staged by stmatrix in the warp's rows of V's tile and stored by one TMA copy that the
// warp's first lane issues and waits to have read (before the rows are written again, and
// before the block exits). Keys past kept_keys lie outside the descriptors' extent: the copy
// engine skips them; logical key n is physical row n * kv_stride through the descriptors' row
// stride.
template <typename T, typename SmemTensor, typename Mma, typename Accumulator>
__device__ __forceinline__ void store_gradients_by_tma(
    const KernelParams<T>& params, const SmemTensor& sV, const Mma& mma_dkv, const Accumulator& dk,
    const Accumulator& dv, float dk_scale, const BlockWork<T::kBlockM, T::kBlockN>& work, int tid) {
  using namespace cute;
  using Element = typename T::Element;
  using RowsTile = typename T::StoreTile;
  auto stage_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
  auto thread_stage = stage_copy.get_thread_slice(tid);
  Tensor staged = thread_stage.partition_D(sV);
  // Consumer warp w holds key rows 16 w .. 16 w + 15 of the block; the column split's warp w holds
  // rows 16 (w % 4) .. of its warpgroup's half of the columns.
  constexpr int kRowTiles = T::kBlockN / T::StoreRows::value;
  const int warp = tid / 32;
  const int row_tile = T::kColumnSplit ? warp % kRowTiles : warp;
  // The warp's tile at row tile `row` (column tile 0 a constant where the columns are not split).
  const auto tile_at = [&](auto row) {
    if constexpr (T::kColumnSplit) {
      return make_coord(row, warp / kRowTiles);
    } else {
      return make_coord(row, _0{});
    }
  };
  const bool issues = tid % 32 == 0;
  Tensor warp_rows = local_tile(sV, RowsTile{}, tile_at(row_tile));
  auto store = [&](const auto& tma, const Accumulator& values, float scale) {
    Tensor rounded = make_tensor_like<Element>(values);
    convert_pairs<Element>(values, rounded, scale);
    copy(stage_copy, thread_stage.retile_S(rounded), staged);
    cutlass::arch::fence_view_async_shared();  // the stores, before the copy engine reads them
    __syncwarp();
    if (issues) {
      Tensor gradient = tma.get_tma_tensor(params.shape_k);
      Tensor rows = local_tile(gradient(_, _, work.h_kv, work.b), RowsTile{},
                               tile_at(work.n_begin / T::StoreRows::value + row_tile));
      auto parts = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(warp_rows),
                                 group_modes<0, 2>(rows));
      copy(tma, get<1>(parts), get<0>(parts));
      tma_store_arrive();
      tma_store_wait<0>();
    }
    __syncwarp();
  };
  store(params.store_dv, dv, 1.f);
  store(params.store_dk, dk, dk_scale);
}

// Physical rows between the block's kept keys (row % kv_stride != 0) get zero gradients. Warp
// v of the consumers takes the rows after kept keys v, v + 8, ..., its lanes a row's pairs: no
// division per element (a 64-bit remainder by kv_stride per pair cost more than the rest of the
// block's end).
template <typename T>
__device__ __forceinline__ void zero_rows_between_kept_keys(
    const detail::BackwardKernelParams& p, const BlockWork<T::kBlockM, T::kBlockN>& work, int tid,
    int lane) {
  using Element = typename T::Element;
  const detail::ForwardKernelParams& f = p.fwd;
  if (f.kv_stride <= 1) return;
  const int64_t first_row = work.n_begin * f.kv_stride;
  const int64_t end_row = min((work.n_begin + T::kBlockN) * f.kv_stride, p.seqlen_k);
  Element* dk_head =
      static_cast<Element*>(p.dk) + work.b * p.dk_batch_stride + work.h_kv * p.dk_head_stride;
  Element* dv_head =
      static_cast<Element*>(p.dv) + work.b * p.dv_batch_stride + work.h_kv * p.dv_head_stride;
  constexpr int kPairs = T::kHeadDim / 2;
  constexpr int kWarps = BackwardConfig::kConsumerThreads / 32;
  for (int64_t key_row = first_row + tid / 32 * f.kv_stride; key_row < end_row;
       key_row += kWarps * f.kv_stride) {
    const int64_t gap_end = min(key_row + f.kv_stride, end_row);
    for (int64_t row = key_row + 1; row < gap_end; ++row) {
      uint32_t* dk_pairs = reinterpret_cast<uint32_t*>(dk_head + row * p.dk_row_stride);
      uint32_t* dv_pairs = reinterpret_cast<uint32_t*>(dv_head + row * p.dv_row_stride);
      for (int pair = lane; pair < kPairs; pair += 32) {
        dk_pairs[pair] = 0u;
        dv_pairs[pair] = 0u;
      }
    }
  }
}

// A consumer thread's wgmma operands in the block's shared-memory tiles (descriptors, not
// registers), for its thread slices of the S^T / dP^T, the dK / dV and the dQ products:
// K, V (MMA, 1, D/16); Q, dO (MMA, 1, D/16, stage) for S^T and dP^T; dO^T, Q^T (MMA, 1,
// kBlockM/16, stage) for dV and dK; dS (MMA, M, kBlockN/16, buffer) and K^T (MMA, 1, kBlockN/16)
// for dQ.
template <typename T, typename SdpSlice, typename DkvSlice, typename DqSlice>
__device__ __forceinline__ auto operand_descriptors(typename T::SharedStorage& shared,
                                                    const SdpSlice& sdp, const DkvSlice& dkv,
                                                    const DqSlice& dq) {
  using namespace cute;
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(shared.k.data()), typename T::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(shared.dout.data()), typename T::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(shared.q.data()), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(shared.dout.data()), typename T::SmemLayoutQt{});
  Tensor sdS = make_tensor(make_smem_ptr(shared.ds.data()), typename T::SmemLayoutDs{});
  return make_tuple(sdp.partition_fragment_A(sK), sdp.partition_fragment_A(sV),
                    sdp.partition_fragment_B(sQ), sdp.partition_fragment_B(sdO),
                    dkv.partition_fragment_B(sdOt), dkv.partition_fragment_B(sQt),
                    dq.partition_fragment_A(sdS), dq.partition_fragment_B(sKt));
}

// Issues a step's S^T = K Q^T and dP^T = V dO^T wgmmas (Q and dO: the stage's operands, which
// have landed) and turns them into P^T = exp2(S^T scale log2 e - lse log2 e), masked, and
// dS^T = P^T (dP^T - D), in place, waiting for each product as it needs it (nothing else may be
// in flight: the waits count these two groups). The warpgroup's 64 keys start at key_begin;
// local_key holds the block rows (from n_begin) of a thread's two accumulator rows.
template <typename T, typename Mma, typename KeyOperand, typename QueryOperand,
          typename Accumulator, typename Coordinates>
__device__ __forceinline__ void softmax_gradients(
    Mma& mma_sdp, const KeyOperand& tSrK, const KeyOperand& tSrV, const QueryOperand& tSrQ,
    const QueryOperand& tSrdO, Accumulator& tSrS, Accumulator& tSrdP, const Coordinates& tScS,
    const int (&local_key)[2], int64_t key_begin, int64_t m_begin, int64_t n_begin,
    const detail::ForwardKernelParams& f, float scale_log2, const float* lse_log2,
    const float* delta) {
  using namespace cute;
  constexpr int kBlockM = T::kBlockM;
  issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_sdp, tSrK, tSrQ, tSrS);
  issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_sdp, tSrV, tSrdO, tSrdP);
  // Key n is visible to query m iff n < kept_keys and (causal) n * kv_stride <= m: in S^T, row
  // n's visible columns start at first_visible. Only blocks crossing the end of the keys or the
  // causal diagonal need the test.
  const bool needs_mask =
      key_begin + 64 > f.kept_keys || (f.causal && (key_begin + 63) * f.kv_stride > m_begin);
  int first_visible[2] = {0, 0};
  if (needs_mask) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int64_t key = n_begin + local_key[r];
      const int64_t first = key >= f.kept_keys ? kBlockM
                            : f.causal         ? key * f.kv_stride - m_begin
                                               : 0;
      first_visible[r] = static_cast<int>(max(min(first, int64_t{kBlockM}), int64_t{0}));
    }
  }

  warpgroup_wait<1>();  // S^T has landed (wgmma groups complete in order)
  warpgroup_fence_operand(tSrS);
  // P^T; the per-element mask test only on the steps that need it (one copy of the loop each).
  auto exponentials = [&](bool masked) {
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      const int col = get<1>(tScS(i));
      float x = tSrS(i) * scale_log2 - lse_log2[col];
      if (masked && col < first_visible[(i / 2) % 2]) x = -INFINITY;
      tSrS(i) = fast_exp2(x);
    }
  };
  if (needs_mask) {
    exponentials(true);
  } else {
    exponentials(false);
  }
  warpgroup_wait<0>();  // dP^T has landed
  warpgroup_fence_operand(tSrdP);
  CUTE_UNROLL
  for (int i = 0; i < size(tSrdP); ++i) {
    tSrdP(i) = tSrS(i) * (tSrdP(i) - delta[get<1>(tScS(i))]);
  }
}

template <typename T>
__device__ __forceinline__ void consume(const KernelParams<T>& params,
                                        typename T::SharedStorage& shared,
                                        const BlockWork<T::kBlockM, T::kBlockN>& work) {
  using namespace cute;
  using Element = typename T::Element;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kBlockM = T::kBlockM;
  const detail::BackwardKernelParams& p = params.p;
  const detail::ForwardKernelParams& f = p.fwd;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0..255 over the consumer warpgroups
  // Read through a shuffle so that ptxas knows it is uniform over the warp: branches on it (who
  // computes dQ) then do not count as divergent paths, where ptxas would serialize every wgmma.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);

  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmaDKV mma_dkv;
  typename T::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  // dQ's thread index: one warpgroup's, or both (the split schedule).
  const int dq_thread = T::kAlternateDq ? tid % 128 : tid;
  auto thr_dq = mma_dq.get_thread_slice(dq_thread);

  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutKV{});
  Tensor sdSt = make_tensor(make_smem_ptr(shared.ds.data()), typename T::SmemLayoutDst{});
  auto [tSrK, tSrV, tSrQ, tSrdO, tdVrdO, tdKrQ, tdQrdS, tdQrKt] =
      operand_descriptors<T>(shared, thr_sdp, thr_dkv, thr_dq);
  // dS^T leaves through stmatrix, one instruction per four 8 x 8 blocks (32-bit stores with
  // swizzled 64-bit addresses rebuilt every step were 105 instructions per warp and step and
  // 4.4% of the stall samples under ncu, stop 30).
  auto ds_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thread_ds_store = ds_store.get_thread_slice(tid);
  Tensor tDSsdSt = thread_ds_store.partition_D(sdSt);  // (CPY, CPY_M, CPY_N, buffer)

  const auto sdp_tile = Shape<typename T::BlockN, typename T::BlockM>{};
  const auto dkv_tile = Shape<typename T::BlockN, typename T::HeadDim>{};
  const auto dq_tile = Shape<typename T::BlockM, typename T::HeadDim>{};
  Tensor tdVrdV = partition_fragment_C(mma_dkv, dkv_tile);
  Tensor tdKrdK = partition_fragment_C(mma_dkv, dkv_tile);
  // (key, query) of every S^T element.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(sdp_tile));
  // A thread holds two key rows of its warp's 16: element i of an accumulator is in row half
  // (i / 2) % 2 (wgmma's fragment order: column pair, row half, 8-column group).
  const int local_key[2] = {get<0>(tScS(0)), get<0>(tScS(2))};

  const float scale_log2 = static_cast<float>(f.scale_log2);
  const bool accumulate_dq = p.dq_accum != nullptr;  // deterministic: another kernel does dQ
  float* dq_accum = static_cast<float*>(p.dq_accum);
  // The warpgroup's keys [key_begin, key_begin + 64): uniform over the warpgroup, so the mask
  // test below does not diverge.
  const int64_t key_begin = work.n_begin + 64 * warpgroup;
  clear(tdVrdV);
  clear(tdKrdK);
  if (work.steps > 0) shared.barrier_kv.wait(0);
  // Each warp's first lane issues the warp's bulk reductions of its slots of its warpgroup's
  // staging tile.
  const int lane = tid % 32;
  const bool issues_dq = lane == 0;
  float* dq_staging = shared.dq[warpgroup].data();
  const int64_t dq_rows_per_head = backward_dq_accum_rows(f.seqlen_q, kHeadDim);

  // Where the step's dQ goes in the accumulator: the chunk of its (batch, head, query block).
  auto dq_chunk_of = [&](int64_t h, int64_t m_begin) {
    return ((work.b * f.heads_q + h) * dq_rows_per_head + m_begin) * kHeadDim;
  };
  // kDeferDq: warpgroup w arrives at ds_ready(w, s) once its half of step s's dS is in shared
  // memory, and the other syncs on it before it issues that step's dQ. kDsReadyCycle ids per
  // warpgroup, by step, so that an arrival can never count toward an earlier step's barrier
  // ("Ordering").
  auto ds_ready = [](int writer, int64_t step) {
    return kDsReadyBarrier + static_cast<uint32_t>(2 * (step % kDsReadyCycle) + writer);
  };
  // Warpgroup 1 starts once warpgroup 0's first dS is in shared memory, about half a step late,
  // so that from then on one's softmax runs under the other's GEMMs; that sync also covers
  // warpgroup 0's step 0 for the later wait.
  auto wait_for_other_ds = [&](int64_t step) {
    if (warpgroup == 0 || step > 0) {
      cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads,
                                        ds_ready(1 - warpgroup, step));
    }
  };
  if (T::kDeferDq && accumulate_dq && warpgroup == 1 && work.steps > 0) {
    cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads, ds_ready(0, 0));
  }
  int64_t pending_dq_chunk = 0;  // kDeferDq: the chunk of the previous step's dQ

  auto cursor = work.first_step(p);
  for (int64_t step = 0; step < work.steps; ++step) {
    const int stage = static_cast<int>(step % T::kStages);
    const uint32_t phase = static_cast<uint32_t>(step / T::kStages) & 1u;
    const int buffer = static_cast<int>(step % T::kDsBuffers);
    const int64_t h = cursor.h;
    const int64_t m_begin = int64_t{cursor.m_block} * kBlockM;
    cursor.next(work);
    // kAlternateDq: warpgroup 1 computes the dQ of even steps, warpgroup 0 that of odd ones, each
    // after the other has arrived at the step's barrier (one per step parity: a warpgroup may
    // arrive for step + 1 before the other has passed the barrier of step). kDeferDq: both
    // compute the previous step's dQ, from the previous buffer.
    const int parity = static_cast<int>(step & 1);
    const bool computes_dq = accumulate_dq && (T::kAlternateDq ? warpgroup != parity
                                               : T::kDeferDq   ? step > 0
                                                               : true);
    const int dq_buffer =
        T::kDeferDq ? static_cast<int>((step + T::kDsBuffers - 1) % T::kDsBuffers) : buffer;
    const uint32_t ds_barrier = kDsReadyBarrier + (T::kAlternateDq ? parity : 0);

    // The step's fragments are declared here, not above the loop: a wgmma reads its accumulator
    // operand even when told to zero it, so an accumulator that outlived the step would stay
    // live (and take registers) across the whole loop.
    Tensor tSrS = partition_fragment_C(mma_sdp, sdp_tile);   // S^T, then P^T (fp32)
    Tensor tSrdP = partition_fragment_C(mma_sdp, sdp_tile);  // dP^T, then dS^T (fp32)
    Tensor tdVrP = make_tensor<Element>(accumulator_as_a_operand(tSrS.layout()));
    Tensor tdKrdS = make_tensor<Element>(accumulator_as_a_operand(tSrdP.layout()));
    static_assert(size<2>(decltype(tdVrP){}) == kBlockM / 16, "one P^T k-block per 16 queries");

    shared.full[stage].wait(phase);
    softmax_gradients<T>(mma_sdp, tSrK, tSrV, tSrQ(_, _, _, stage), tSrdO(_, _, _, stage), tSrS,
                         tSrdP, tScS, local_key, key_begin, m_begin, work.n_begin, f, scale_log2,
                         shared.lse_log2[stage], shared.delta[stage]);
    // Nothing is in flight here, so S^T and dP^T (64 fp32 registers) become the 16-bit P^T and
    // dS^T (16 registers) before the next GEMMs take registers.
    convert_pairs<Element>(tSrS, tdVrP);
    convert_pairs<Element>(tSrdP, tdKrdS);
    if (accumulate_dq) {
      // The 16-bit dS^T in the accumulator's layout (convert_pairs kept the element order).
      Tensor tSrdS = make_tensor(tdKrdS.data(), tSrdP.layout());
      copy(ds_store, thread_ds_store.retile_S(tSrdS), tDSsdSt(_, _, _, buffer));
    }
    issue_gemm</*kZeroInit=*/false, /*kAInRegisters=*/true>(mma_dkv, tdVrP, tdVrdO(_, _, _, stage),
                                                            tdVrdV);
    if (accumulate_dq) {
      cutlass::arch::fence_view_async_shared();  // dS stores -> visible to the async proxy
      if (T::kDeferDq) {
        cutlass::arch::NamedBarrier::arrive(BackwardConfig::kConsumerThreads,
                                            ds_ready(warpgroup, step));
      } else if (!computes_dq) {
        cutlass::arch::NamedBarrier::arrive(BackwardConfig::kConsumerThreads, ds_barrier);
      } else if (!T::kAlternateDq) {
        cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads, ds_barrier);
      }
    }
    Tensor tdQrdQ = partition_fragment_C(mma_dq, dq_tile);
    if constexpr (!T::kAlternateDq) {
      if (T::kDeferDq ? accumulate_dq : computes_dq) {
        if constexpr (T::kDeferDq) {
          if (step > 0) wait_for_other_ds(step - 1);
        }
        issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_dq, tdQrdS(_, _, _, dq_buffer),
                                                                tdQrKt, tdQrdQ);
      }
    }
    issue_gemm</*kZeroInit=*/false, /*kAInRegisters=*/true>(mma_dkv, tdKrdS, tdKrQ(_, _, _, stage),
                                                            tdKrdK);
    if constexpr (T::kAlternateDq) {
      if (computes_dq) {
        cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads, ds_barrier);
        // dV has landed: P^T's registers are free before dQ's accumulator takes 64 more.
        warpgroup_wait<1>();
        warpgroup_fence_operand(tdVrdV);
        warpgroup_fence_operand(tdVrP);
        issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_dq, tdQrdS(_, _, _, buffer),
                                                                tdQrKt, tdQrdQ);
        warpgroup_wait<1>();  // dK has landed
      } else {
        warpgroup_wait<0>();
      }
    } else {
      // dV and dQ have landed (kDeferDq, step 0: the discarded dQ); dK += dS^T Q runs on while
      // dQ is staged.
      warpgroup_wait<1>();
      warpgroup_fence_operand(tdQrdQ);
      if (computes_dq) {
        wait_staging_read(issues_dq);
        stage_dq<T>(tdQrdQ, dq_staging, dq_thread);
      }
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(tdVrdV);
    warpgroup_fence_operand(tdVrP);
    warpgroup_fence_operand(tdKrdK);
    warpgroup_fence_operand(tdKrdS);
    shared.empty[stage].arrive();  // the tensor cores are done with Q, dO, lse and D
    if (computes_dq) {
      if constexpr (T::kAlternateDq) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdQrdQ);
        wait_staging_read(issues_dq);
        stage_dq<T>(tdQrdQ, dq_staging, dq_thread);
      }
      const int64_t chunk = T::kDeferDq ? pending_dq_chunk : dq_chunk_of(h, m_begin);
      reduce_staged_dq<T>(dq_accum + chunk, dq_staging, dq_thread, issues_dq);
    }
    if constexpr (T::kDeferDq) pending_dq_chunk = dq_chunk_of(h, m_begin);
  }
  // kDeferDq: the last step's dQ, once the other warpgroup's half of its dS is in shared memory.
  // Its wgmma runs while dK and dV are stored; it is staged and reduced after them.
  const bool flush_dq = T::kDeferDq && accumulate_dq && work.steps > 0;
  Tensor tdQrdQ = partition_fragment_C(mma_dq, dq_tile);
  if constexpr (T::kDeferDq) {
    if (flush_dq) {
      wait_for_other_ds(work.steps - 1);
      // Defined before the wgmma takes it: left undefined here, ptxas reports the accumulator
      // defined inside the pipeline stage and serializes the kernel's wgmmas (C7515).
      clear(tdQrdQ);
      const int last_buffer = static_cast<int>((work.steps - 1) % T::kDsBuffers);
      issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_dq, tdQrdS(_, _, _, last_buffer),
                                                              tdQrKt, tdQrdQ);
    }
  } else {
    // The block's shared memory must outlive the last bulk reduction's read of it.
    if (accumulate_dq && issues_dq) bulk_wait_all();
  }

  const float scale = static_cast<float>(p.scale);
  store_gradients_by_tma(params, sV, mma_dkv, tdKrdK, tdVrdV, scale, work, tid);
  if constexpr (T::kDeferDq) {
    if (flush_dq) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdQrdQ);
      wait_staging_read(issues_dq);
      stage_dq<T>(tdQrdQ, dq_staging, dq_thread);
      reduce_staged_dq<T>(dq_accum + pending_dq_chunk, dq_staging, dq_thread, issues_dq);
    }
    if (accumulate_dq && issues_dq) bulk_wait_all();
  }
  zero_rows_between_kept_keys<T>(p, work, tid, lane);
}

}  // namespace samattn::hopper::bwd
