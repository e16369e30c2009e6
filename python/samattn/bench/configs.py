"""What one benchmark row measures, and its FLOP count."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


@dataclass(frozen=True)
class AttentionConfig:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = False
    kv_stride: int = 1
    heads_kv: int = 0  # 0: same as heads
    direction: str = "fwd"  # "fwd" or "bwd"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def kv_heads(self) -> int:
        return self.heads_kv or self.heads

    @property
    def kept_keys(self) -> int:
        return math.ceil(self.seqlen / self.kv_stride)

    def visible_pairs(self) -> float:
        """(query, key) pairs that attend, per (batch, head)."""
        if not self.causal:
            return float(self.seqlen) * self.kept_keys
        # Query i sees keys n * kv_stride <= i: floor(i / kv_stride) + 1 of them.
        s, r = self.seqlen, self.kv_stride
        full, rest = divmod(s, r)
        return float(r * full * (full + 1) // 2 + rest * (full + 1))

    def flops(self) -> float:
        """Forward: 4 * B * H * (visible pairs) * D (two matmuls); backward: 2.5x forward."""
        forward = 4.0 * self.batch * self.heads * self.visible_pairs() * self.head_dim
        return forward * (2.5 if self.direction == "bwd" else 1.0)

    def label(self) -> str:
        parts = [f"B{self.batch} H{self.heads}"]
        if self.heads_kv:
            parts.append(f"Hkv{self.heads_kv}")
        parts.append(f"S{self.seqlen} D{self.head_dim} {self.dtype}")
        if self.causal:
            parts.append("causal")
        if self.kv_stride > 1:
            parts.append(f"stride{self.kv_stride}")
        parts.append(self.direction)
        return " ".join(parts)

    def as_dict(self) -> dict:
        return asdict(self)
