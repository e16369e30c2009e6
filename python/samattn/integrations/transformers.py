"""Hugging Face transformers plug-in: `attn_implementation="samattn"`.

    import samattn.integrations.transformers as samattn_hf
    samattn_hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="samattn")

The attention function receives (batch, heads, seq_len, head_dim) query/key/value from the model
and returns (batch, seq_len, heads, head_dim), like transformers' "sdpa" implementation. The mask
builder is transformers' SDPA one: a causal batch without padding arrives as `attention_mask=None`
and runs samattn's causal kernel; grouped-query attention runs natively (no repeat of K/V). A
batch with padding (or any other explicit mask) passes its boolean mask to
samattn.attention(attn_mask=...).
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from samattn.functional import attention

NAME = "samattn"


def samattn_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                              dropout: float = 0.0, scaling: Optional[float] = None,
                              is_causal: Optional[bool] = None, *, num_splits: int = 1,
                              **kwargs) -> Tuple[torch.Tensor, None]:
    if dropout != 0.0:
        raise NotImplementedError(f"samattn attention: dropout must be 0.0, got {dropout} "
                                  "(set the model's attention_dropout to 0)")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("samattn attention: position_bias is not supported")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        # A single decoding query sees the whole cache; a prefill sees its own prefix. With an
        # empty static cache the keys beyond q_len are unused, as in transformers' sdpa path.
        causal = bool(is_causal) and q_len > 1
        if causal and kv_len > q_len:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        out = attention(query, key, value, causal=causal, scale=scaling, num_splits=num_splits)
    else:
        # transformers' 4-D mask (grouped heads run natively, the mask broadcasts over them).
        out = attention(query, key, value, scale=scaling, attn_mask=attention_mask,
                        num_splits=num_splits)
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME, *, num_splits: int = 1) -> None:
    """Registers samattn as `attn_implementation=name` (default "samattn") in transformers.

    num_splits: samattn.attention's split-key option (see its docstring) for every call, so the
    decoding steps against the cache split, unmasked or with a padded batch's mask: 0 splits
    automatically. Default 1 (never)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    forward = samattn_attention_forward
    if num_splits != 1:
        forward = functools.partial(samattn_attention_forward, num_splits=num_splits)
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
