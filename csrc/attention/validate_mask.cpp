// Checks of AttentionParams::mask (samattn/mask.h): element mask dtype, window, pattern and the
// varlen description. Shared by the CUDA path and the CPU reference.
#include "attention/validate.h"
#include "common/check.h"
#include "samattn/mask.h"

namespace samattn {

const char* mask_dtype_name(MaskDType dtype) {
  switch (dtype) {
    case MaskDType::kBool:
      return "bool";
    case MaskDType::kFloat64:
      return "float64";
    case MaskDType::kFloat32:
      return "float32";
    case MaskDType::kFloat16:
      return "float16";
    case MaskDType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

const char* sparse_pattern_name(SparsePattern pattern) {
  switch (pattern) {
    case SparsePattern::kNone:
      return "none";
    case SparsePattern::kStrided:
      return "strided";
    case SparsePattern::kFixed:
      return "fixed";
  }
  return "unknown";
}

namespace detail {
namespace {

bool is_known_mask_dtype(MaskDType dtype) {
  switch (dtype) {
    case MaskDType::kBool:
    case MaskDType::kFloat64:
    case MaskDType::kFloat32:
    case MaskDType::kFloat16:
    case MaskDType::kBFloat16:
      return true;
  }
  return false;
}

MaskDType mask_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return MaskDType::kFloat64;
    case DType::kFloat32:
      return MaskDType::kFloat32;
    case DType::kFloat16:
      return MaskDType::kFloat16;
    case DType::kBFloat16:
      return MaskDType::kBFloat16;
  }
  return MaskDType::kFloat32;
}

}  // namespace

void validate_mask_options(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  if (m.has_element_mask()) {
    SAMATTN_CHECK(is_known_mask_dtype(m.dtype), "attn_mask dtype ", static_cast<int>(m.dtype),
                  " is not one of bool, float64, float32, float16, bfloat16");
    SAMATTN_CHECK(m.dtype == MaskDType::kBool || m.dtype == MaskDType::kFloat32 ||
                      m.dtype == mask_dtype_of(p.dtype),
                  "attn_mask dtype must be bool, float32 or the inputs' dtype (",
                  dtype_name(p.dtype), "), got ", mask_dtype_name(m.dtype));
  }
  if (m.has_block_map()) {
    SAMATTN_CHECK(m.block_q >= 1 && m.block_k >= 1,
                  "block-sparse block sizes must be >= 1, got block_q = ", m.block_q,
                  ", block_k = ", m.block_k);
  }
  SAMATTN_CHECK(m.window_left >= -1, "window_left must be >= 0 or -1 (unbounded), got ",
                m.window_left);
  SAMATTN_CHECK(m.window_right >= -1, "window_right must be >= 0 or -1 (unbounded), got ",
                m.window_right);
  switch (m.pattern) {
    case SparsePattern::kNone:
      break;
    case SparsePattern::kStrided:
      SAMATTN_CHECK(m.pattern_block >= 1, "sparse pattern 'strided' needs block (l) >= 1, got ",
                    m.pattern_block);
      break;
    case SparsePattern::kFixed:
      SAMATTN_CHECK(m.pattern_block >= 1, "sparse pattern 'fixed' needs block (l) >= 1, got ",
                    m.pattern_block);
      SAMATTN_CHECK(m.pattern_summary >= 1 && m.pattern_summary <= m.pattern_block,
                    "sparse pattern 'fixed' needs summary (c) in [1, block = ", m.pattern_block,
                    "], got ", m.pattern_summary);
      break;
    default:
      SAMATTN_CHECK(false, "sparse pattern ", static_cast<int>(m.pattern),
                    " is not one of none, strided, fixed");
  }
  SAMATTN_CHECK(!m.window_follows_causal || m.causal_lower_right,
                "mask.window_follows_causal places the window around the bottom-right diagonal: "
                "it needs mask.causal_lower_right");
  if (m.causal_lower_right) {
    SAMATTN_CHECK(!p.causal,
                  "causal (top-left) and mask.causal_lower_right (bottom-right) are both set; "
                  "expected at most one");
    SAMATTN_CHECK(m.pattern == SparsePattern::kNone, "mask.causal_lower_right with sparse pattern ",
                  sparse_pattern_name(m.pattern),
                  ": the patterns are top-left causal by definition; expected pattern none");
  }
  SAMATTN_CHECK((m.cu_seqlens_q == nullptr) == (m.cu_seqlens_k == nullptr),
                "cu_seqlens_q and cu_seqlens_k must be given together (varlen), got ",
                m.cu_seqlens_q == nullptr ? "only cu_seqlens_k" : "only cu_seqlens_q");
  SAMATTN_CHECK(!(m.has_cache_seqlens() && m.is_varlen()),
                "cache_seqlens (per-entry key lengths of a dense batch) with varlen: "
                "cu_seqlens_k already gives each sequence its keys; expected one of the two");
  if (m.is_paged()) {
    SAMATTN_CHECK(m.has_cache_seqlens(),
                  "a paged KV cache (block_table) needs cache_seqlens, the entries' lengths");
    SAMATTN_CHECK(m.page_size >= 1 && m.num_pages >= 1,
                  "a paged KV cache needs page_size >= 1 and num_pages >= 1, got page_size ",
                  m.page_size, " and num_pages ", m.num_pages);
    const int64_t columns = (p.seqlen_k + m.page_size - 1) / m.page_size;
    SAMATTN_CHECK(p.batch <= 1 || m.block_table_stride >= columns,
                  "block_table_stride must be >= ceil(seqlen_k / page_size) = ", columns,
                  " (one row of page numbers per batch entry), got ", m.block_table_stride);
  }
  if (m.is_varlen()) {
    SAMATTN_CHECK(m.total_q >= 0 && m.total_k >= 0, "varlen total_q and total_k must be >= 0, got ",
                  m.total_q, " and ", m.total_k);
    SAMATTN_CHECK(p.q_strides.batch == 0 && p.k_strides.batch == 0 && p.v_strides.batch == 0 &&
                      p.out_strides.batch == 0,
                  "varlen q, k, v and out are packed (total, heads, dim): their batch strides must "
                  "be 0, got ",
                  p.q_strides.batch, ", ", p.k_strides.batch, ", ", p.v_strides.batch, ", ",
                  p.out_strides.batch);
  }
}

void validate_host_cu_seqlens(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  if (!m.is_varlen()) return;
  auto check = [&](const int32_t* cu, int64_t total, int64_t max_len, const char* name,
                   const char* max_name) {
    SAMATTN_CHECK(cu[0] == 0, name, "[0] must be 0, got ", cu[0]);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t length = static_cast<int64_t>(cu[b + 1]) - cu[b];
      SAMATTN_CHECK(length >= 0, name, " must be non-decreasing, got ", name, "[", b, "] = ", cu[b],
                    " > ", name, "[", b + 1, "] = ", cu[b + 1]);
      SAMATTN_CHECK(length <= max_len, "sequence ", b, " has ", length, " rows by ", name, " but ",
                    max_name, " is ", max_len);
    }
    SAMATTN_CHECK(cu[p.batch] == total, name, "[batch] must equal the total tokens ", total,
                  ", got ", cu[p.batch]);
  };
  check(m.cu_seqlens_q, m.total_q, p.seqlen_q, "cu_seqlens_q", "max_seqlen_q");
  check(m.cu_seqlens_k, m.total_k, p.seqlen_k, "cu_seqlens_k", "max_seqlen_k");
}

void validate_host_cache_seqlens(const AttentionParams& p) {
  if (!p.mask.has_cache_seqlens()) return;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t length = p.mask.cache_seqlens[b];
    SAMATTN_CHECK(length >= 0 && length <= p.seqlen_k, "cache_seqlens[", b, "] is ", length,
                  ", expected 0 <= value <= seqlen_k (", p.seqlen_k, ")");
  }
}

}  // namespace detail
}  // namespace samattn
