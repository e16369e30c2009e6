"""samattn: fused attention kernels for every dtype, with a PyTorch front end.

CUDA tensors run samattn's CUDA kernels; CPU tensors run the fp64 reference implementation
(slow and exact: use it to check results).
"""

from samattn import nn
from samattn.block_sparse import BlockSparse, block_sparse_from_mask, block_sparse_from_pattern
from samattn._ops import ops
from samattn.functional import (
    attention,
    fused_attention,
    fused_attention_with_mask,
    scaled_dot_product_attention,
    selected_backend,
    self_attention,
    strided_attention,
    varlen_attention,
)

__version__ = "0.1.0"

__all__ = [
    "BlockSparse",
    "block_sparse_from_mask",
    "block_sparse_from_pattern",
    "attention",
    "fused_attention",
    "fused_attention_with_mask",
    "nn",
    "ops",
    "scaled_dot_product_attention",
    "selected_backend",
    "self_attention",
    "strided_attention",
    "varlen_attention",
]
