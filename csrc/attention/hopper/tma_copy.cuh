// Internal: how the Hopper kernels see a q/k/v/o (or gradient) tensor for TMA, and the type of a
// TMA copy atom over it, shared by the forward's traits and the backward's.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace samattn::hopper {

// (seqlen, head_dim, heads, batch) extents and element strides of a tensor as TMA sees it.
using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;

// The TMA copy atom (its descriptor travels in the kernel parameters) of CopyOp
// (cute::SM90_TMA_LOAD or cute::SM90_TMA_STORE) between a GmemShape tensor of GmemElement
// (const for loads) and a SmemLayout tile of shape Tile.
template <typename CopyOp, typename GmemElement, typename SmemLayout, typename Tile>
using TmaCopy = decltype(cute::make_tma_copy(
    CopyOp{},
    cute::make_tensor(cute::make_gmem_ptr(static_cast<GmemElement*>(nullptr)), GmemShape{},
                      GmemStride{}),
    SmemLayout{}, Tile{}, cute::_1{}));

}  // namespace samattn::hopper
