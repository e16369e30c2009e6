// Internal: the one definition of which keys a query sees, shared by every kernel (device) and
// the fp64 reference (host). Positions are physical and count from the start of the sequence
// (under varlen, from each sequence's first row): query i, key j.
//
// Two questions, answered here and nowhere else:
//   - structurally_visible(i, j): causal, sliding window and Sparse Transformer pattern;
//   - classify_block(...): for a rectangle of queries x keys, whether no pair is visible (skip),
//     every pair is (full: no masking work) or some are (partial: mask element by element).
// kv_stride and the element mask tensor are applied by the callers on top (the tensor's values
// are read where the data lives: mask_policy.cuh on the device, the reference on the host).
#pragma once

#include <cstdint>

#include "samattn/mask.h"

#if defined(__CUDACC__)
#define SAMATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAMATTN_HOST_DEVICE inline
#endif

namespace samattn::detail {

// The structural part of a mask, copied by value into the kernel parameters.
struct MaskPolicy {
  bool causal;           // top-left, or bottom-right where lower_right
  int64_t window_left;   // -1: unbounded
  int64_t window_right;  // -1: unbounded
  SparsePattern pattern;
  int64_t block;    // pattern's l
  int64_t summary;  // pattern's c (kFixed)
  // Causal lets query i see positions j <= i + causal_shift: 0 is top-left; bottom-right is the
  // sequence's seqlen_k - seqlen_q, which for_sequence() sets where lower_right is.
  int64_t causal_shift = 0;
  bool lower_right = false;
  // The window around the bottom-right diagonal (MaskOptions::window_follows_causal): query i's
  // window is centred on i + causal_shift instead of i.
  bool window_shifted = false;
};

// Where query i's window is centred: i, or i + causal_shift when it follows bottom-right causal.
SAMATTN_HOST_DEVICE int64_t window_shift(const MaskPolicy& p) {
  return p.window_shifted ? p.causal_shift : 0;
}

enum class BlockClass : int { kSkip, kPartial, kFull };

SAMATTN_HOST_DEVICE MaskPolicy make_mask_policy(bool causal, const MaskOptions& m) {
  return MaskPolicy{causal || m.causal_lower_right,
                    m.window_left,
                    m.window_right,
                    m.pattern,
                    m.pattern_block,
                    m.pattern_summary,
                    0,
                    m.causal_lower_right,
                    m.window_follows_causal};
}

// The policy of a sequence of seqlen_q queries and seqlen_k (physical) keys: bottom-right
// causal's shift comes from the lengths (per sequence under varlen).
SAMATTN_HOST_DEVICE MaskPolicy for_sequence(MaskPolicy p, int64_t seqlen_q, int64_t seqlen_k) {
  if (p.lower_right) p.causal_shift = seqlen_k - seqlen_q;
  return p;
}

// True when the policy never hides a key (only the element mask, kv_stride and lengths may).
SAMATTN_HOST_DEVICE bool policy_is_dense(const MaskPolicy& p) {
  return !p.causal && p.window_left < 0 && p.window_right < 0 && p.pattern == SparsePattern::kNone;
}

SAMATTN_HOST_DEVICE int64_t floor_div(int64_t a, int64_t b) {
  // kv_stride is almost always 1: skip the 64-bit division (about 70 instructions on the GPU,
  // several per row in every masked kernel's prologue).
  if (b == 1) return a;
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

SAMATTN_HOST_DEVICE bool structurally_visible(const MaskPolicy& p, int64_t i, int64_t j) {
  const bool causal = p.causal || p.pattern != SparsePattern::kNone;
  if (causal && j > i + p.causal_shift) return false;
  const int64_t c = i + window_shift(p);  // the window's centre
  if (p.window_left >= 0 && j < c - p.window_left) return false;
  if (p.window_right >= 0 && j > c + p.window_right) return false;
  switch (p.pattern) {
    case SparsePattern::kNone:
      return true;
    case SparsePattern::kStrided:
      return i - j < p.block || (i - j) % p.block == 0;
    case SparsePattern::kFixed:
      return j / p.block == i / p.block || j % p.block >= p.block - p.summary;
  }
  return true;
}

// The key range [begin, end) that a query range [q_begin, q_end) (non-empty) can see at all, from
// causal and the window; `seqlen_k` bounds it. Patterns only thin keys out inside this range.
struct KeyRange {
  int64_t begin, end;
};

SAMATTN_HOST_DEVICE KeyRange visible_key_range(const MaskPolicy& p, int64_t q_begin, int64_t q_end,
                                               int64_t seqlen_k) {
  int64_t begin = 0, end = seqlen_k;
  const bool causal = p.causal || p.pattern != SparsePattern::kNone;
  if (causal && q_end + p.causal_shift < end) end = q_end + p.causal_shift;
  const int64_t shift = window_shift(p);
  if (p.window_right >= 0 && q_end + shift + p.window_right < end) {
    end = q_end + shift + p.window_right;
  }
  if (p.window_left >= 0 && q_begin + shift - p.window_left > begin) {
    begin = q_begin + shift - p.window_left;
  }
  if (begin > seqlen_k) begin = seqlen_k;
  if (end < begin) end = begin;
  return {begin, end};
}

// The logical keys [begin, end) that query i sees by causal and the window, logical key n being
// position n * kv_stride, clipped to [0, kept_keys) (both ends at most kept_keys); empty
// (begin == end) when it sees none.
// Patterns and masks only thin keys out inside it. Both ends are non-decreasing in i, so a block
// of rows sees keys in [span(first row).begin, span(last row).end) and every row of it sees
// [span(last row).begin, span(first row).end).
struct Span {
  int64_t begin, end;
};

SAMATTN_HOST_DEVICE Span visible_key_span(const MaskPolicy& p, int64_t i, int64_t kept_keys,
                                          int64_t kv_stride) {
  const bool causal = p.causal || p.pattern != SparsePattern::kNone;
  int64_t begin = 0, end = kept_keys;
  // n * s <= i + shift (causal) and n * s <= i + right: n <= floor(x / s).
  if (causal && floor_div(i + p.causal_shift, kv_stride) + 1 < end) {
    end = floor_div(i + p.causal_shift, kv_stride) + 1;
  }
  const int64_t c = i + window_shift(p);  // the window's centre
  if (p.window_right >= 0 && floor_div(c + p.window_right, kv_stride) + 1 < end) {
    end = floor_div(c + p.window_right, kv_stride) + 1;
  }
  // n * s >= c - left: n >= ceil((c - left) / s).
  if (p.window_left >= 0 && -floor_div(p.window_left - c, kv_stride) > begin) {
    begin = -floor_div(p.window_left - c, kv_stride);
  }
  // A row whose window starts past the last key sees none: its empty span sits at kept_keys, so
  // no caller's key range (first row's begin to last row's end) reaches past the keys.
  if (begin > kept_keys) begin = kept_keys;
  if (end < begin) end = begin;
  return {begin, end};
}

// The queries [begin, end) that see logical key n (position n * kv_stride) by causal and the
// window, clipped to [0, seqlen_q) (both ends at most seqlen_q); the transpose of
// visible_key_span, for the backward.
SAMATTN_HOST_DEVICE Span visible_query_span(const MaskPolicy& p, int64_t n, int64_t seqlen_q,
                                            int64_t kv_stride) {
  const bool causal = p.causal || p.pattern != SparsePattern::kNone;
  const int64_t j = n * kv_stride;
  int64_t begin = 0, end = seqlen_q;
  if (causal && j - p.causal_shift > begin) begin = j - p.causal_shift;  // j <= i + shift
  const int64_t w = j - window_shift(p);  // j relative to the windows' centres
  if (p.window_right >= 0 && w - p.window_right > begin) begin = w - p.window_right;   // j <= c + r
  if (p.window_left >= 0 && w + p.window_left + 1 < end) end = w + p.window_left + 1;  // j >= c - l
  if (begin > seqlen_q) begin = seqlen_q;  // a key first seen past the last query: empty at the end
  if (end < begin) end = begin;
  return {begin, end};
}

// Classifies the rectangle of queries [q0, q1) x keys [k0, k1) (both non-empty, keys in
// range). Exact for causal and the window; for the patterns it is exact when it says kSkip or
// kFull and may answer kPartial for a block whose pairs happen to be all visible.
SAMATTN_HOST_DEVICE BlockClass classify_block(const MaskPolicy& p, int64_t q0, int64_t q1,
                                              int64_t k0, int64_t k1) {
  const int64_t qa = q0, qb = q1 - 1, ka = k0, kb = k1 - 1;  // inclusive corners
  const bool causal = p.causal || p.pattern != SparsePattern::kNone;
  // Differences d = i - j over the block range over [qa - kb, qb - ka].
  const int64_t d_min = qa - kb, d_max = qb - ka;
  int64_t lo = d_min, hi = d_max;  // visible differences by causal and window: [lo, hi]
  bool band_full = true;
  if (causal && lo < -p.causal_shift) {
    lo = -p.causal_shift;
    band_full = false;
  }
  // The window bounds d = i - j to [-(shift + right), left - shift].
  const int64_t shift = window_shift(p);
  if (p.window_right >= 0 && lo < -(shift + p.window_right)) {
    lo = -(shift + p.window_right);
    band_full = false;
  }
  if (p.window_left >= 0 && hi > p.window_left - shift) {
    hi = p.window_left - shift;
    band_full = false;
  }
  if (lo > hi) return BlockClass::kSkip;
  switch (p.pattern) {
    case SparsePattern::kNone:
      return band_full ? BlockClass::kFull : BlockClass::kPartial;
    case SparsePattern::kStrided: {
      // Some difference in [lo, hi] is < block or a multiple of block?
      if (lo < p.block) {
        return (band_full && hi < p.block) ? BlockClass::kFull : BlockClass::kPartial;
      }
      const int64_t next_multiple = ((lo + p.block - 1) / p.block) * p.block;
      return next_multiple <= hi ? BlockClass::kPartial : BlockClass::kSkip;
    }
    case SparsePattern::kFixed: {
      // Same block for every pair: all queries and keys inside one pattern block.
      const int64_t bq0 = qa / p.block, bq1 = qb / p.block;
      const int64_t bk0 = ka / p.block, bk1 = kb / p.block;
      if (band_full && bq0 == bq1 && bk0 == bk1 && bq0 == bk0) return BlockClass::kFull;
      // Some key in the same block as some query (within the band), or a summary column?
      const bool shares_block = bk1 >= bq0 && bk0 <= bq1;
      // A summary column in [ka, kb]: a j with j % block >= block - summary. (Summary 0, the
      // own blocks alone, is the decomposition's local part: fixed_pattern.h.)
      const int64_t first_summary_in_block = bk0 * p.block + p.block - p.summary;
      const bool has_summary =
          p.summary > 0 && (kb - ka + 1 >= p.block || first_summary_in_block <= kb ||
                            (ka % p.block) >= p.block - p.summary);
      return (shares_block || has_summary) ? BlockClass::kPartial : BlockClass::kSkip;
    }
  }
  return BlockClass::kPartial;
}

}  // namespace samattn::detail
