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
    paged_attention,
    scaled_dot_product_attention,
    selected_backend,
    self_attention,
    strided_attention,
    varlen_attention,
)
from samattn.kv_cache import KVCache, PagedKVCache
from samattn.linalg import attention_unfused, gemm, gemm_kernel, softmax

__version__ = "0.1.0"

__all__ = [
    "BlockSparse",
    "KVCache",
    "PagedKVCache",
    "block_sparse_from_mask",
    "block_sparse_from_pattern",
    "attention",
    "attention_unfused",
    "fused_attention",
    "fused_attention_with_mask",
    "gemm",
    "gemm_kernel",
    "nn",
    "ops",
    "paged_attention",
    "scaled_dot_product_attention",
    "selected_backend",
    "softmax",
    "self_attention",
    "strided_attention",
    "varlen_attention",
]
