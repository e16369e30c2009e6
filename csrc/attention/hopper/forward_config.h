// Internal: tile shapes of the Hopper (sm_90a, wgmma + TMA) forward kernel. Plain C++ so the
// host dispatcher can read shared-memory sizes and grid shapes without including CuTe or device
// code.
#pragma once

#include <cstdint>

namespace samattn::hopper {

// Head dimensions with an instantiation (fp16 and bf16; q and v share it). 96 runs head dim 128's
// tiles (its own table differs only in one_softmax_copy); 192 has its own, whose entry 0 is head
// dim 256's tile (forward_tile).
inline constexpr int kSupportedHeadDims[] = {64, 96, 128, 192, 256};

constexpr bool is_supported_head_dim(int64_t head_dim) {
  for (int d : kSupportedHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// One block = one producer warpgroup (a single thread issues every TMA copy) and
// consumer_warpgroups consumer warpgroups, each owning 64 query rows of the block's tile (the
// wgmma M of one warpgroup is 64). block_n keys per pipeline stage, `stages` K and V stages,
// q_buffers Q tiles (2: the next tile's Q loads while the current one is still in use).
struct ForwardTile {
  int consumer_warpgroups;
  int block_n;
  int stages;
  int q_buffers;
  // setmaxnreg target of the producer warpgroup (its TMA-issuing thread and the scheduler
  // thread); the consumers share the rest of the pool (consumer_registers).
  int producer_registers;
  // A lean start of each tile: the producer, which decodes every tile for its copies, publishes
  // the decoded coordinates next to the Q buffer (the consumers decoded them again after their
  // Q wait: ~700 cycles at head dim 128), and each consumer warpgroup issues the tile's first
  // S GEMM before it finds its masked-block bounds (~600-750 cycles), which then run under the
  // GEMM (the tile timeline of benchmarks/NOTES.md, stop 19).
  bool lean_tile_start = false;
  // The tile's Q goes out before its first K. With two Q buffers the next tile's buffer is
  // free long before a K stage is (its last user is the tile before); the tile timeline of stop
  // 30 has the Q copy issued only once the first K's stage had freed, ~0.7k cycles before the
  // current tile's last turn, and landing ~2.5k cycles later, after the epilogue. One process
  // (stop 30): +1-4.5% at head dim 128 S <= 2k, 0.975x on kv_stride 4, nothing at head dim 64;
  // three processes (stop 31): +1.5% on average at head dim 128 S <= 2k, 16 of 18 cells above
  // 1; a fourth (stop 32): +1-2% at S <= 2k, 0.97-1.01x at S >= 4k, 0.97x on kv_stride 4. So
  // head dim 128 runs it on short problems without kv_stride (kShortTile128).
  bool early_q = false;
  // Each thread's two rows' key limits (one past the last key each sees) are computed once per
  // tile, under its first S GEMM, and a masked causal block compares with them: the masked
  // softmax otherwise reads the sequence's geometry again and divides each row by kv_stride in
  // every masked block (~620 instructions against the unmasked softmax's 318 at head dim 64,
  // sass-report), and a causal tile's first block, its diagonal, is masked: stop 33's reading
  // of the D = 64 causal S = 1k trace (the first softmax 2.8k cycles, an unmasked one 1.5k).
  // Costs 2 registers through the key loop. Not with a window (its spans stay per block).
  bool hoisted_limits = false;
  // A key block's softmax is inlined once per call site, masked or not (masks applied to the
  // raw scores, which the fused FFMA scales), not once more for unmasked blocks: fwd:64:1 7328
  // SASS instructions against 8040 (sass-report). Side by side with it in every entry (stop 43,
  // H200, bf16, two processes each): +4.7% at head dim 64 causal 512 (entry 1), +1% at 64
  // causal 1k and 2k (entry 0), +3% at 192 and +1.5% at 96 (S = 4k); but -1.2 to -1.6% at 128
  // dense S <= 2k and -3.3% at 256 dense 4k, and head dim 64's entry 0 ran dense and causal 4k
  // in 1-2% more cycles than at e0804df in four processes (cuDNN's within 0.4% and 1%): where
  // unmasked blocks dominate, the shared copy costs. So head dim 64's short causal entries, head
  // dim 192's and head dim 96's entry 0 (kTiles96) have it.
  bool one_softmax_copy = false;

  constexpr int block_m() const { return 64 * consumer_warpgroups; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups); }
  // The pool __launch_bounds__(threads, 1) gives the block (per thread: 65536 / threads in
  // multiples of 8) less the producer's, split among the consumer threads in multiples of 8
  // (setmaxnreg's granularity): 168 x 384 - 128 x 40 = 256 x 232 with two consumer warpgroups.
  constexpr int consumer_registers() const {
    const int per_thread_at_launch = 65536 / threads() / 8 * 8;
    const int pool = per_thread_at_launch * threads() - 128 * producer_registers;
    return pool / (128 * consumer_warpgroups) / 8 * 8;
  }
};

// Head dim 64: S (64 fp32 registers per thread at 128 keys), P (32) and O (32) leave room, and
// 3 stages of K and V (96 KiB) keep the copy engine ahead of a MUFU-bound softmax; 2 Q tiles
// (32 KiB). Per key block and consumer warp the GEMMs take 512 tensor clocks and 64 ex2 per
// thread 512 MUFU clocks. (Until stop 24 one exponential in 8 ran on the FMA pipe in the
// two-warpgroup tile, to take the MUFU to 448: its registers made ptxas serialize that kernel's
// wgmmas (C7511), with 1 in 16 too, and the three-warpgroup tiles measured 3-6% slower with it
// in the first H200 run, the issue slots and not the MUFU being their limit; so it is gone.)
// Head dim 128: S 64 + P 32 + O 64 registers; 2 Q tiles + 2 stages = 192 KiB.
// Head dim 256: O alone is 128 registers; 80 keys per stage (S 40, P 20) is the widest that lets
// one Q tile (64 KiB) and 2 stages of K and V (160 KiB) fit the 227 KiB an H100 block may opt in
// to. The next tile's Q then waits until the consumers are done with the current one.
//
// Every head dim has a table of tile variants; entry kDefaultTile* is the one the library runs,
// except at head dim 64 for short causal problems, which run entry kShortCausalTile64, and at
// head dim 128 for short problems without kv_stride, which run entry kShortTile128
// (tile_variant_for_shape). Those entries are what every build compiles. A build with
// -DSAMATTN_HOPPER_TUNING=ON (benchmarks only) also compiles the others, and
// SAMATTN_HOPPER_TILE=<index> picks any compiled entry at run time, so one benchmark run
// measures them side by side (forward_dispatch.cpp).
// Head dim 64: [0] three consumer warpgroups (192 x 128 tiles, 160 registers each: S 64 + P 32
// + O 32: a third softmax next to the tensor cores) with a lean tile start; [1] two consumer
// warpgroups (128 x 128 tiles) with a lean tile start, which short causal problems run; [2] entry
// 1 with ForwardTile::hoisted_limits (stop 34: 1.00-1.01x its twin). Head dim 128: [0] 2 stages of
// 128 x 128 K and V, 2 Q buffers, a lean tile start (ForwardTile::lean_tile_start: +3-7% at S <= 2k
// causal in stop 20's first run); [1] entry 2 with ForwardTile::hoisted_limits (stop 34: 1.00-1.01x
// its twin); [2] entry 0 with ForwardTile::early_q, which short problems run. (A third stage of
// K alone, with two Q buffers, measured 0.99-1.00x the default at S <= 2k and slower on the
// kv_stride = 4 case in stop 19: the tile timeline showed that K lands in time. 3 stages of K and V
// with one Q buffer, 224 KiB, was entry 1 until stop 33: 0.75-0.99x the default in every run.)
// Producer registers: 40 (consumers 232) where the consumers fit that without spilling, else 24
// (consumers 240), where ptxas spills a few bytes in the producer's single TMA thread (under 24 the
// published work unit and the tile walk no longer fit); 32 with three consumer warpgroups. Measured
// and removed (benchmarks/NOTES.md, stops 24-30): the two-warpgroup tile at head dim 64 with
// FMA-pipe exponentials (its registers serialised its wgmmas), the tiles without a lean start, an
// overlapped tile boundary (the next tile's first S GEMM under the epilogue: 0.90-0.95x the default
// in three runs; at 2 stages the next tile's first K lands after the last P V it should hide
// behind; commit 7aaaa7a has it), a lean mask alone (masked causal blocks through the fused FFMA:
// 0.98-1.02x; with ForwardTile::one_softmax_copy it gains) and, at head dim 64, the early Q copy
// (entry 2 until stop 33: 0.99-1.02x its twin, entry 1).
inline constexpr ForwardTile kTiles64[] = {{3, 128, 3, 2, 32, true},
                                           {2, 128, 3, 2, 40, true, false, false, true},
                                           {2, 128, 3, 2, 40, true, false, true, true}};
inline constexpr ForwardTile kTiles128[] = {
    {2, 128, 2, 2, 40, true}, {2, 128, 2, 2, 40, true, true, true}, {2, 128, 2, 2, 40, true, true}};
// Head dim 96: head dim 128's tiles, entry 0 with one_softmax_copy. Stop 44 (H200, bf16, commit
// db65ea8 against 7750ae5, two processes each): head dim 96 at S = 4k ran 1.024x dense and 1.029x
// causal with it, while head dim 128, whose entry it was, lost 1.6-4.4% at S = 4k-16k; so only
// the head dim 96 instantiation (which the library already compiled) changes.
inline constexpr ForwardTile kTiles96[] = {
    {2, 128, 2, 2, 40, true, false, false, true}, kTiles128[1], kTiles128[2]};
inline constexpr ForwardTile kTiles256[] = {{2, 80, 2, 1, 24}};
// Head dim 192: [0] head dim 256's tile (48 + 120 KiB); [1] with two Q buffers (96 + 120 KiB),
// so that the next tile's Q loads under the current one and O leaves through the free buffer by
// TMA (the staged store needs two); [2] 112 keys per stage (48 + 168 KiB; S 56 + P 28 + O 96
// registers), fewer key blocks and O rescales per tile. 128 keys would need 240 KiB.
inline constexpr ForwardTile kTiles192[] = {{2, 80, 2, 1, 24, false, false, false, true},
                                            {2, 80, 2, 2, 24, false, false, false, true},
                                            {2, 112, 2, 1, 24, false, false, false, true}};
// Second H200 run (commit 2771218, bench_hopper_forward.py, every variant in one process): at
// D = 64 the three-warpgroup tile beat the two-warpgroup one (then with FMA-pipe exponentials,
// and serialized if it compiled then as it did in stop 24) at every S >= 2k (0.98-1.10x cuDNN
// against 0.87-0.95x) and at S <= 1k non-causal, and lost at S <= 1k causal. Stop 20 (commits
// 8ab7516, f1058d9): the lean tile start gained 2-11% at S <= 2k over the same tile without it
// at D = 128 and 2-8% at S <= 2k causal at D = 64 (benchmarks/NOTES.md has the tables).
inline constexpr int kDefaultTile64 = 0;
inline constexpr int kDefaultTile128 = 0;
// Head dim 192 (commit 67beb05, one process, S = 4k, bf16): entry 1 634 / 591 TFLOPS dense /
// causal, entry 2 645 / 569, entry 0 610 / 552, cuDNN 641 / 570 (benchmarks/NOTES.md, stop 33).
inline constexpr int kDefaultTile192 = 1;
inline constexpr int kDefaultTile256 = 0;

// Head dim 64, causal, at most 512 queries and kept keys: the two-warpgroup tile (entry 1). Its
// 128-row tiles cover less of the diagonal than 192-row ones, which counts where tiles walk only
// a few key blocks. Measured side by side (H200, bf16, H = 16, B * S = 16k): at commit 6d99e5d
// it won causal 512 and 1k and lost causal 2k and non-causal 1k; since the tile lookahead and
// the tail of single tiles (commit 274cf90, benchmarks/NOTES.md stop 41) entry 0 is 3.3% faster
// at causal 1k (280.9 against 271.8 TFLOPS; 207.4k against 214.7k cycles) and ties at 512;
// with this rule (commit e0804df) entry 0 ran causal 1k in 204.1k cycles, entry 1 in 211.5k.
inline constexpr int kShortCausalTile64 = 1;
inline constexpr int64_t kShortCausalMaxSeqlen64 = 512;

// Head dim 128, kv_stride 1, at most 2048 queries and kept keys, causal or not: entry 2 (early
// Q; ForwardTile::early_q has the measurements). A tile there walks at most 16 key blocks, so
// the Q copy that the next tile waits for is a larger share of it; with kv_stride 4 the early
// Q copy delays the first strided K copy instead (0.97x).
inline constexpr int kShortTile128 = 2;
inline constexpr int64_t kShortMaxSeqlen128 = 2048;

constexpr int tile_variants(int64_t head_dim) {
  if (head_dim <= 64) return static_cast<int>(sizeof(kTiles64) / sizeof(kTiles64[0]));
  if (head_dim <= 96) return static_cast<int>(sizeof(kTiles96) / sizeof(kTiles96[0]));
  if (head_dim <= 128) return static_cast<int>(sizeof(kTiles128) / sizeof(kTiles128[0]));
  if (head_dim <= 192) return static_cast<int>(sizeof(kTiles192) / sizeof(kTiles192[0]));
  return static_cast<int>(sizeof(kTiles256) / sizeof(kTiles256[0]));
}

constexpr int default_tile_variant(int64_t head_dim) {
  if (head_dim <= 64) return kDefaultTile64;
  if (head_dim <= 128) return kDefaultTile128;
  if (head_dim <= 192) return kDefaultTile192;
  return kDefaultTile256;
}

// The entry the library runs for a problem (SAMATTN_HOPPER_TILE unset). kept_keys is
// ceil(seqlen_k / kv_stride), the keys a tile walks; for varlen, the longest sequences.
constexpr int tile_variant_for_shape(int64_t head_dim, bool causal, int64_t seqlen_q,
                                     int64_t kept_keys, int64_t kv_stride) {
  const bool short_causal =
      causal && seqlen_q <= kShortCausalMaxSeqlen64 && kept_keys <= kShortCausalMaxSeqlen64;
  if (head_dim <= 64 && short_causal) return kShortCausalTile64;
  const bool short_unstrided =
      kv_stride == 1 && seqlen_q <= kShortMaxSeqlen128 && kept_keys <= kShortMaxSeqlen128;
  if (head_dim > 64 && head_dim <= 128 && short_unstrided) return kShortTile128;
  return default_tile_variant(head_dim);
}

// Whether a build without SAMATTN_HOPPER_TUNING compiles the entry (CMakeLists.txt instantiates
// the same entries).
constexpr bool tile_in_every_build(int64_t head_dim, int variant) {
  return variant == default_tile_variant(head_dim) ||
         (head_dim <= 64 && variant == kShortCausalTile64) ||
         (head_dim > 64 && head_dim <= 128 && variant == kShortTile128);
}

// The caller keeps variant within [0, tile_variants(head_dim)).
constexpr ForwardTile forward_tile(int64_t head_dim, int variant) {
  if (head_dim <= 64) return kTiles64[variant];
  if (head_dim <= 96) return kTiles96[variant];
  if (head_dim <= 128) return kTiles128[variant];
  if (head_dim <= 192) return kTiles192[variant];
  return kTiles256[variant];
}

constexpr ForwardTile forward_tile(int64_t head_dim) {
  return forward_tile(head_dim, default_tile_variant(head_dim));
}

// Some of the kernel's features as run-time switches, so one benchmark run can measure what
// each is worth (SAMATTN_HOPPER_ABLATION, read by the launcher on every call; all at these
// defaults unless it names them).
struct ForwardKernelOptions {
  bool pingpong = true;      // consumer warpgroups take turns issuing their GEMMs
  bool staged_store = true;  // O leaves through shared memory by TMA store (two Q buffers)
  // The persistent grid takes its units from a work counter (forward_scheduler.h); off
  // ("static_schedule"): the fixed round robin.
  bool dynamic_schedule = true;
  // Varlen (host side) with one block per work unit ("varlen_block_per_unit"): the hardware hands
  // the units, of a cost only the device knows (their sequences' lengths), to whichever SM is
  // free. What varlen runs when no work counter can be had (a graph being captured); otherwise
  // the counter balances as well and keeps the prefetch across units (H200, 11 sequences,
  // 16k tokens: 0.316 ms against 0.341 ms).
  bool varlen_block_per_unit = false;
  // A warpgroup whose rows see only the first half of a tile's first key block (the causal
  // diagonal under the tile's first 64 rows, a tail of at most block_n / 2 keys) runs that
  // block's softmax on those keys alone; its S GEMM stays the whole block's
  // ("wide_first_block" turns it off). Warpgroup 0 of a causal tile then reaches its first turn
  // before warpgroup 1, whose first block is a whole masked one: the two no longer run their
  // masked first softmaxes in step with the tensor cores idle under both (stop 33's D = 64
  // causal 1k trace: first softmax 2.8k cycles, the warpgroups within 0.1k of each other).
  bool narrow_first_block = true;
  // Block-sparse calls: the producer asks the list warp for a tile's key-block masks before it
  // finds the tile's coordinates, and the list warp finds them too, so that both run at once
  // ("list_after_coords": asked once the producer has them, as until stop 36).
  bool list_under_coords = true;
  // Block-sparse calls: the tile's Q copy goes out before the producer waits for the list, and
  // the consumers wait for the masks on a barrier of their own ("q_after_list": the Q copy
  // where a tile without a map has it, after the list, as until stop 37).
  bool q_before_list = true;
  // With a positive scale, a masked block's raw scores are masked and go through the fused
  // FFMA, as an unmasked block's do: with a window in every tile, and with any mask in the
  // tiles with ForwardTile::one_softmax_copy ("scaled_mask": scaled first, then masked, as until
  // stop 37 with a window and until stop 42 without one).
  bool lean_mask = true;
  // With two Q buffers, a tile of more than `stages` key blocks takes the next tile's
  // coordinates and issues its Q two key blocks before its last, so that only the next tile's
  // first K is in flight at the boundary (forward_producer.cuh; "no_lookahead": the next tile's
  // coordinates and Q at the boundary, as until stop 38).
  bool tile_lookahead = true;
  // Causal calls: the last heads' tiles, at least two rounds of units, go out one by one,
  // heaviest first, rather than in pairs (forward_scheduler.h; "paired_tail": pairs to the end,
  // as until stop 39).
  bool tail_singles = true;
  // Causal calls without a window, block map or varlen batch: when seqlen_q is not a multiple of
  // the tile's rows, the tiles start up to block_m - 64 rows before row 0 (a multiple of 64,
  // TileGeometry::tile_row_shift), so that the tile short of rows is the first, which walks the
  // fewest key blocks, and not the last, which walks them all with most of its warpgroups idle
  // (head dim 64's 192-row tiles at causal S = 1k: 27 tile key blocks a head against 32, and no
  // 8-block tile run by one warpgroup; "partial_last_tile": the short tile last, as until stop 48).
  bool partial_first_tile = true;
};

// Block-sparse calls (a block map): the kernel keeps, per Q buffer, one bit per key block for
// each consumer warpgroup (its rows' map entry lists the block) and one for the tile (any of
// them does), over the first kMaxListedKeyBlocks key blocks: 512 x 128 keys = 64k keys at head
// dims 64 and 128. Longer calls run on the tensor-core masked kernel (supports()). 64 bytes a
// mask, so that the mbarriers, the published tiles and these masks together stay within the
// kBarrierBytes below (forward_traits.cuh's static_assert): the tiles are whole multiples of
// 1024 bytes, so a block's shared memory, and the L1 the SM keeps beside it, is the same as
// before the masks were added.
inline constexpr int kMaxListedKeyBlocks = 512;

// Q tiles + stages x (K tile + V tile), plus a little for the mbarriers and the key-block masks
// (checked against the kernel's SharedStorage by a static_assert in forward_traits.cuh).
inline constexpr int kBarrierBytes = 1024;
constexpr int forward_smem_bytes(const ForwardTile& tile, int64_t head_dim, int element_bytes) {
  const int64_t elements = int64_t{tile.q_buffers} * tile.block_m() * head_dim +
                           2 * int64_t{tile.stages} * tile.block_n * head_dim;
  return static_cast<int>(elements * element_bytes) + kBarrierBytes;
}

constexpr int forward_smem_bytes(int64_t head_dim, int element_bytes) {
  return forward_smem_bytes(forward_tile(head_dim), head_dim, element_bytes);
}

}  // namespace samattn::hopper
