// Host side of the Hopper forward: whether a call can take it, and the (dtype, head dim) switch.
// Compiled into the main library for every build; the launchers exist only with
// SAMATTN_HAVE_SM90.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "attention/alignment.h"
#include "attention/hopper/forward_config.h"
#include "attention/hopper/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::hopper {
namespace {

Status unsupported(const std::string& why) {
  return Status::failure("backend hopper does not support " + why);
}

// Whether this build has the tile table entry: tile_in_every_build's, or with
// SAMATTN_HOPPER_TUNING every entry (the instantiations CMakeLists.txt generates).
constexpr bool tile_compiled(int64_t head_dim, int variant) {
#ifdef SAMATTN_HOPPER_TUNING
  (void)head_dim;
  (void)variant;
  return true;
#else
  return tile_in_every_build(head_dim, variant);
#endif
}

#ifdef SAMATTN_HAVE_SM90
// A block map on the Hopper forward (forward_key_blocks.cuh): each consumer warpgroup's 64 rows
// lie in one map row, each key block in one map column, and the listed key blocks fit the
// kernel's masks. Varlen sequences start at any row of the packed tensors, so their tiles do
// not line up with the map's rows: they run on the tensor-core masked kernel.
Status supports_block_map(const AttentionParams& p, const ForwardTile& tile) {
  const MaskOptions& m = p.mask;
  if (m.is_varlen()) return unsupported("a block map with varlen");
  constexpr int64_t kRowsPerWarpgroup = 64;
  constexpr int64_t kMaxBlockSize = int64_t{1} << 30;  // the kernel divides in int32
  if (m.block_q % kRowsPerWarpgroup != 0 || m.block_q > kMaxBlockSize) {
    return unsupported(detail::concat("a block map with block_q ", m.block_q,
                                      " (it runs here with a multiple of ", kRowsPerWarpgroup,
                                      " up to ", kMaxBlockSize, ")"));
  }
  if (m.block_k % tile.block_n != 0 || m.block_k > kMaxBlockSize) {
    return unsupported(detail::concat("a block map with block_k ", m.block_k, " at head_dim ",
                                      p.head_dim, " (it runs here with a multiple of ",
                                      tile.block_n, " up to ", kMaxBlockSize, ")"));
  }
  const int64_t key_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  if (key_blocks > kMaxListedKeyBlocks) {
    return unsupported(detail::concat("a block map with seqlen_k ", p.seqlen_k, " at head_dim ",
                                      p.head_dim, " (it runs here up to ",
                                      int64_t{kMaxListedKeyBlocks} * tile.block_n, " keys)"));
  }
  return Status::success();
}
#endif

}  // namespace

Status supports(const AttentionParams& p) {
#ifndef SAMATTN_HAVE_SM90
  (void)p;
  return unsupported(
      "this build: the sm_90a kernels were not compiled (no CuTe headers at configure time)");
#else
  // A sliding window is a per-row key range (with causal, kv_stride and the sequence ends), a
  // varlen sequence a dense problem at an offset of the packed tensors, and a block map a list
  // of whole key blocks per tile; the other options need the masked kernels' per-element work.
  const MaskOptions& m = p.mask;
  if (m.has_element_mask() || m.pattern != SparsePattern::kNone) {
    return unsupported(
        "attn_mask and sparse patterns in one kernel (they run on the tensor-core masked or SIMT "
        "kernels; a sliding window, varlen and block maps run here, and the fixed pattern's "
        "summary part through its decomposition, attention/fixed_pattern.h)");
  }
  // A window's key range, a varlen sequence's first key row and a block map's columns are
  // kept-key positions only with kv_stride 1 (a varlen sequence may start at any row of the
  // packed k).
  // Bottom-right causal runs as the window's per-row key range.
  if ((m.has_window() || m.causal_lower_right || m.is_varlen() || m.has_block_map()) &&
      p.kv_stride != 1) {
    return unsupported(detail::concat(m.is_varlen()          ? "varlen"
                                      : m.has_window()       ? "a sliding window"
                                      : m.causal_lower_right ? "bottom-right causal"
                                                             : "a block map",
                                      " with kv_stride ", p.kv_stride,
                                      " (it runs here with kv_stride 1)"));
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return unsupported(
        detail::concat("dtype ", dtype_name(p.dtype), " (supported: float16, bfloat16)"));
  }
  if (p.head_dim != p.head_dim_v) {
    return unsupported(detail::concat("head_dim ", p.head_dim, " with head_dim_v ", p.head_dim_v,
                                      " (they must be equal)"));
  }
  if (!is_supported_head_dim(p.head_dim)) {
    return unsupported(detail::concat(
        "head_dim ", p.head_dim, " (supported: ", detail::comma_list(kSupportedHeadDims), ")"));
  }
  const detail::DeviceInfo& device = detail::current_device_info();
  if (device.major != 9 || device.minor != 0) {
    return unsupported(detail::concat("compute capability ", device.major, ".", device.minor,
                                      " (needs 9.0: wgmma and TMA are sm_90a instructions)"));
  }
  const int bytes = dtype_size(p.dtype);
  // The tile dispatch_forward will run (it reads the same shape from the kernel parameters).
  const int shape_variant = tile_variant_for_shape(p.head_dim, p.causal, p.seqlen_q,
                                                   detail::strided_key_count(p), p.kv_stride);
  const ForwardTile tile =
      forward_tile(p.head_dim, forward_tile_variant_from_environment(p.head_dim, shape_variant));
  if (m.has_block_map()) {
    const Status map = supports_block_map(p, tile);
    if (!map.ok()) return map;
  }
  const int smem = forward_smem_bytes(tile, p.head_dim, bytes);
  if (smem > device.max_smem_optin) {
    return unsupported(detail::concat("head_dim ", p.head_dim, " on this device: it needs ", smem,
                                      " bytes of shared memory per block, the device allows ",
                                      device.max_smem_optin));
  }
  // TMA coordinates and extents are 32-bit.
  constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;
  if (p.seqlen_q > kMaxExtent || p.seqlen_k > kMaxExtent || p.batch > kMaxExtent ||
      p.heads_q > kMaxExtent || m.total_q > kMaxExtent || m.total_k > kMaxExtent) {
    return unsupported(
        detail::concat("extents above ", kMaxExtent, " (TMA coordinates are 32-bit)"));
  }
  // The persistent kernel numbers its query tiles with int32 and steps through them by the grid
  // size: 2^30 leaves room for the step.
  constexpr int64_t kMaxTiles = int64_t{1} << 30;
  const int64_t block_m = tile.block_m();
  const int64_t tiles = p.batch * p.heads_q * ((p.seqlen_q + block_m - 1) / block_m);
  if (tiles > kMaxTiles) {
    return unsupported(detail::concat("batch * heads_q * ceil(seqlen_q / ", block_m, ") = ", tiles,
                                      " query tiles (at most ", kMaxTiles, ")"));
  }
  // With no kept keys nothing of k and v is read (their strides may be anything, even 0).
  // Varlen tensors are one packed batch of total_q (total_k) rows (their batch stride is 0).
  const int64_t batch = m.is_varlen() ? 1 : p.batch;
  const int64_t rows_q = m.is_varlen() ? m.total_q : p.seqlen_q;
  const int64_t keys = m.is_varlen() ? m.total_k : detail::strided_key_count(p);
  // q, k and v are read and the output is written through TMA descriptors.
  const std::string misaligned[] = {
      detail::misalignment("q", p.q, p.q_strides, p.q_strides.seq, batch, p.heads_q, rows_q, bytes,
                           detail::StrideRule::kTma),
      keys == 0 ? ""
                : detail::misalignment("k", p.k, p.k_strides, p.k_strides.seq * p.kv_stride, batch,
                                       p.heads_kv, keys, bytes, detail::StrideRule::kTma),
      keys == 0 ? ""
                : detail::misalignment("v", p.v, p.v_strides, p.v_strides.seq * p.kv_stride, batch,
                                       p.heads_kv, keys, bytes, detail::StrideRule::kTma),
      detail::misalignment("out", p.out, p.out_strides, p.out_strides.seq, batch, p.heads_q, rows_q,
                           bytes, detail::StrideRule::kTma)};
  for (const std::string& why : misaligned) {
    if (!why.empty()) return unsupported(why);
  }
  return Status::success();
#endif
}

ForwardKernelOptions forward_options_from_environment() {
  ForwardKernelOptions options;
  const char* value = std::getenv("SAMATTN_HOPPER_ABLATION");
  if (value == nullptr) return options;
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item == "no_pingpong") {
      options.pingpong = false;
    } else if (item == "no_staged_store") {
      options.staged_store = false;
    } else if (item == "varlen_block_per_unit") {
      options.varlen_block_per_unit = true;
    } else if (item == "static_schedule") {
      options.dynamic_schedule = false;
    } else if (item == "wide_first_block") {
      options.narrow_first_block = false;
    } else if (item == "list_after_coords") {
      options.list_under_coords = false;
    } else if (item == "q_after_list") {
      options.q_before_list = false;
    } else if (item == "scaled_mask") {
      options.lean_mask = false;
    } else if (item == "no_lookahead") {
      options.tile_lookahead = false;
    } else if (item == "paired_tail") {
      options.tail_singles = false;
    } else if (item == "partial_last_tile") {
      options.partial_first_tile = false;
    } else if (!item.empty()) {
      SAMATTN_CHECK(false,
                    "SAMATTN_HOPPER_ABLATION must be a comma-separated list of "
                    "no_pingpong, no_staged_store, static_schedule, wide_first_block, "
                    "list_after_coords, q_after_list, scaled_mask, no_lookahead, "
                    "paired_tail, partial_last_tile and varlen_block_per_unit, got '",
                    value, "'");
    }
  }
  return options;
}

int forward_tile_variant_from_environment(int64_t head_dim, int fallback) {
  const char* value = std::getenv("SAMATTN_HOPPER_TILE");
  if (value == nullptr || *value == '\0') return fallback;
  const int variants = tile_variants(head_dim);
  if (variants == 1) return fallback;  // one tile (head dim 256): nothing to choose
  char* end = nullptr;
  const long variant = std::strtol(value, &end, 10);
  SAMATTN_CHECK(*end == '\0' && variant >= 0 && variant < variants,
                "SAMATTN_HOPPER_TILE must be a tile variant index in [0, ", variants,
                ") for head_dim ", head_dim, ", got '", value, "'");
  if (!tile_compiled(head_dim, static_cast<int>(variant))) {
    std::string built;
    for (int i = 0; i < variants; ++i) {
      if (tile_compiled(head_dim, i)) built += (built.empty() ? "" : ", ") + std::to_string(i);
    }
    SAMATTN_CHECK(false, "SAMATTN_HOPPER_TILE=", value,
                  " needs a build configured with -DSAMATTN_HOPPER_TUNING=ON (this build has the "
                  "variants ",
                  built, " for head_dim ", head_dim, ")");
  }
  return static_cast<int>(variant);
}

#ifdef SAMATTN_HAVE_SM90
namespace {

// The entries tile_compiled names.
template <DType kDType, int kHeadDim, int kVariant = 0>
void dispatch_variant(int variant, const detail::ForwardKernelParams& params, cudaStream_t stream) {
  if constexpr (kVariant < tile_variants(kHeadDim)) {
    if constexpr (tile_compiled(kHeadDim, kVariant)) {
      if (variant == kVariant) return launch_forward<kDType, kHeadDim, kVariant>(params, stream);
    }
    return dispatch_variant<kDType, kHeadDim, kVariant + 1>(variant, params, stream);
  } else {
    // forward_tile_variant_from_environment allowed only compiled entries.
    SAMATTN_CHECK(false, "Hopper forward tile variant ", variant, " for head_dim ", kHeadDim,
                  " is not compiled into this build");
  }
}

template <DType kDType>
void dispatch_head_dim(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  const int variant = forward_tile_variant_from_environment(
      params.head_dim, tile_variant_for_shape(params.head_dim, params.causal, params.seqlen_q,
                                              params.kept_keys, params.kv_stride));
  switch (params.head_dim) {
    case 64:
      return dispatch_variant<kDType, 64>(variant, params, stream);
    case 96:
      return dispatch_variant<kDType, 96>(variant, params, stream);
    case 128:
      return dispatch_variant<kDType, 128>(variant, params, stream);
    case 192:
      return dispatch_variant<kDType, 192>(variant, params, stream);
    case 256:
      return dispatch_variant<kDType, 256>(variant, params, stream);
  }
  SAMATTN_CHECK(false, "backend hopper does not support head_dim ", params.head_dim,
                " (supported: ", detail::comma_list(kSupportedHeadDims), ")");
}

}  // namespace
#endif

void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params, cudaStream_t stream) {
#ifdef SAMATTN_HAVE_SM90
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_head_dim<DType::kFloat16>(params, stream);
    case DType::kBFloat16:
      return dispatch_head_dim<DType::kBFloat16>(params, stream);
    default:
      break;
  }
  SAMATTN_CHECK(false, "backend hopper does not support dtype ", dtype_name(dtype),
                " (supported: float16, bfloat16)");
#else
  (void)dtype;
  (void)params;
  (void)stream;
  SAMATTN_CHECK(false, "backend hopper is not available in this build (no sm_90a kernels)");
#endif
}

}  // namespace samattn::hopper
