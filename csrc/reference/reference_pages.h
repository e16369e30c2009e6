// Internal: the fp64 reference's reading of a paged KV cache (MaskOptions::block_table): the
// pages' rows gathered into dense host copies, which the reference then reads as any other
// call's keys and values. Host memory only; the table is checked entry by entry.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "samattn/attention.h"

namespace samattn::detail {

// Dense (B, Hkv, seqlen_k, D) copies of the keys and values of `p`'s pages in `k` and `v` (rows
// past an entry's cache_seqlens zero), and `p` reading them instead of the pages.
inline AttentionParams gather_pages(const AttentionParams& p, std::vector<unsigned char>& k,
                                    std::vector<unsigned char>& v) {
  const MaskOptions& m = p.mask;
  const int64_t bytes = dtype_size(p.dtype);
  const int64_t rows = p.batch * p.heads_kv * p.seqlen_k;
  k.assign(rows * p.head_dim * bytes, 0);
  v.assign(rows * p.head_dim_v * bytes, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t j = 0; j < m.cache_seqlens[b]; ++j) {
      const int64_t slot = j / m.page_size;
      const int64_t page = m.block_table[b * m.block_table_stride + slot];
      SAMATTN_CHECK(page >= 0 && page < m.num_pages, "block_table[", b, ", ", slot, "] is ", page,
                    ", expected a page in [0, num_pages = ", m.num_pages, ")");
      const int64_t row = j % m.page_size;
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t dense_row = (b * p.heads_kv + h) * p.seqlen_k + j;
        const int64_t k_from =
            page * p.k_strides.batch + h * p.k_strides.head + row * p.k_strides.seq;
        const int64_t v_from =
            page * p.v_strides.batch + h * p.v_strides.head + row * p.v_strides.seq;
        std::memcpy(k.data() + dense_row * p.head_dim * bytes,
                    static_cast<const unsigned char*>(p.k) + k_from * bytes, p.head_dim * bytes);
        std::memcpy(v.data() + dense_row * p.head_dim_v * bytes,
                    static_cast<const unsigned char*>(p.v) + v_from * bytes, p.head_dim_v * bytes);
      }
    }
  }
  AttentionParams dense = p;
  dense.k = k.data();
  dense.v = v.data();
  dense.k_strides = {p.heads_kv * p.seqlen_k * p.head_dim, p.seqlen_k * p.head_dim, p.head_dim};
  dense.v_strides = {p.heads_kv * p.seqlen_k * p.head_dim_v, p.seqlen_k * p.head_dim_v,
                     p.head_dim_v};
  dense.mask.block_table = nullptr;
  dense.mask.block_table_stride = dense.mask.page_size = dense.mask.num_pages = 0;
  return dense;
}

}  // namespace samattn::detail
