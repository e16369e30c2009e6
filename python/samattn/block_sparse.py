"""Block-sparse attention in FlexAttention's form: for every (batch, head, query block), the
number of key blocks it attends to (kv_num_blocks) and their indices (kv_indices). Only listed
key blocks are computed; an attn_mask passed alongside still applies inside them.

Helpers build the tables from a dense boolean mask or from samattn's built-in patterns (causal,
window, Sparse Transformer strided/fixed), evaluated from their definitions a query block at a
time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


@dataclass
class BlockSparse:
    kv_num_blocks: Tensor  # int32 (B|1, H|1, query blocks)
    kv_indices: Tensor  # int32 (B|1, H|1, query blocks, max listed key blocks)
    block_q: int = 128
    block_k: int = 128

    def to_map(self, seqlen_k: int) -> Tensor:
        """The (B|1, H|1, query blocks, key blocks) uint8 map the kernels read. Built and
        checked once per seqlen_k and kept while the tables stay the same tensors with the same
        version counters (every in-place change bumps them): checking the indices waits for the
        GPU, so a BlockSparse reused across calls, as FlexAttention's BlockMask is, pays that
        wait on its first call only."""
        key = (seqlen_k, self.block_k, self.kv_num_blocks._version, self.kv_indices._version)
        cached = getattr(self, "_cached_map", None)
        if (cached is not None and cached[0] is self.kv_num_blocks
                and cached[1] is self.kv_indices and cached[2] == key):
            return cached[3]
        block_map = self._build_map(seqlen_k)
        self._cached_map = (self.kv_num_blocks, self.kv_indices, key, block_map)
        return block_map

    def _build_map(self, seqlen_k: int) -> Tensor:
        if self.kv_num_blocks.dtype != torch.int32 or self.kv_indices.dtype != torch.int32:
            raise TypeError("samattn: kv_num_blocks and kv_indices must be int32, got "
                            f"{self.kv_num_blocks.dtype} and {self.kv_indices.dtype}")
        if self.kv_indices.dim() != 4 or self.kv_num_blocks.shape != self.kv_indices.shape[:3]:
            raise ValueError("samattn: kv_indices must be (B|1, H|1, query blocks, max blocks) "
                             "and kv_num_blocks its first three dimensions, got "
                             f"{tuple(self.kv_indices.shape)} and "
                             f"{tuple(self.kv_num_blocks.shape)}")
        key_blocks = -(-seqlen_k // self.block_k)
        slots = torch.arange(self.kv_indices.shape[-1], device=self.kv_indices.device)
        listed = slots < self.kv_num_blocks.unsqueeze(-1)
        indices = self.kv_indices.long()
        if bool(((indices < 0) | (indices >= key_blocks))[listed].any()):
            raise ValueError(f"samattn: kv_indices must be in [0, {key_blocks}) for the listed "
                             "entries")
        counts = torch.zeros(*self.kv_indices.shape[:3], key_blocks, dtype=torch.int32,
                             device=self.kv_indices.device)
        counts.scatter_add_(-1, indices.clamp(0, key_blocks - 1), listed.to(torch.int32))
        return (counts > 0).to(torch.uint8)


def from_map(block_map: Tensor, block_q: int, block_k: int) -> BlockSparse:
    """Tables listing the nonzero entries of a (B|1, H|1, query blocks, key blocks) map."""
    listed = block_map != 0
    num = listed.sum(-1).to(torch.int32)
    # Listed key blocks first, in increasing order (a stable sort of "not listed").
    order = torch.sort((~listed).to(torch.int8), dim=-1, stable=True).indices
    width = max(int(num.max()) if num.numel() else 0, 1)
    return BlockSparse(num, order[..., :width].to(torch.int32).contiguous(), block_q, block_k)


def block_sparse_from_mask(mask: Tensor, block_q: int = 128, block_k: int = 128) -> BlockSparse:
    """Lists every block of a (B|1, H|1, Sq, Sk) boolean mask that has a True element."""
    if mask.dtype != torch.bool or mask.dim() != 4:
        raise ValueError("samattn: block_sparse_from_mask needs a 4-D boolean mask, got "
                         f"{mask.dtype} of shape {tuple(mask.shape)}")
    b, h, sq, sk = mask.shape
    qb, kb = -(-sq // block_q), -(-sk // block_k)
    padded = torch.zeros(b, h, qb * block_q, kb * block_k, dtype=torch.bool, device=mask.device)
    padded[..., :sq, :sk] = mask
    blocks = padded.view(b, h, qb, block_q, kb, block_k).any(dim=5).any(dim=3)
    return from_map(blocks, block_q, block_k)


def pattern_visibility(rows: Tensor, cols: Tensor, *, causal: bool = False,
                       window: Optional[Tuple[int, int]] = None, sparse_pattern: str = "none",
                       sparse_block: int = 0, sparse_summary: int = 0) -> Tensor:
    """The built-in options' visibility of query positions `rows` (column vector) and key
    positions `cols` (row vector), from their definitions."""
    visible = torch.ones(rows.shape[0], cols.shape[1], dtype=torch.bool, device=rows.device)
    if causal or sparse_pattern != "none":
        visible &= cols <= rows
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= cols >= rows - left
        if right >= 0:
            visible &= cols <= rows + right
    if sparse_pattern == "strided":
        d = rows - cols
        visible &= (d < sparse_block) | (d % sparse_block == 0)
    elif sparse_pattern == "fixed":
        visible &= ((cols // sparse_block) == (rows // sparse_block)) | \
            ((cols % sparse_block) >= sparse_block - sparse_summary)
    elif sparse_pattern != "none":
        raise ValueError(f"samattn: unknown sparse_pattern {sparse_pattern!r}")
    return visible


def block_sparse_from_pattern(seqlen_q: int, seqlen_k: int, *, block_q: int = 128,
                              block_k: int = 128, device=None, **pattern) -> BlockSparse:
    """Tables of the blocks a built-in pattern (causal=, window=, sparse_pattern=, sparse_block=,
    sparse_summary=) touches, evaluated one query block at a time; shape (1, 1, ...)."""
    qb, kb = -(-seqlen_q // block_q), -(-seqlen_k // block_k)
    blocks = torch.zeros(1, 1, qb, kb, dtype=torch.bool, device=device)
    cols = torch.arange(kb * block_k, device=device)[None, :]
    for q in range(qb):
        rows = torch.arange(q * block_q, min((q + 1) * block_q, seqlen_q), device=device)[:, None]
        visible = pattern_visibility(rows, cols, **pattern)
        visible[:, seqlen_k:] = False
        blocks[0, 0, q] = visible.view(rows.shape[0], kb, block_k).any(-1).any(0)
    return from_map(blocks, block_q, block_k)
