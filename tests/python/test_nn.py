"""samattn.nn.MultiheadAttention: against torch.nn.MultiheadAttention and a float64 oracle,
GQA, causal, strided, gradients and training."""

from __future__ import annotations

import math

import pytest
import torch

import samattn
from helpers import assert_close, assert_close_tensor_core, requires_cuda


def oracle_mha(module: samattn.nn.MultiheadAttention, x: torch.Tensor, causal: bool,
               kv_stride: int = 1) -> torch.Tensor:
    """The module's computation written out in float64 with torch ops (repeat for GQA)."""
    x = x.double()
    w = {n: p.detach().double() for n, p in module.named_parameters()}
    batch, seq, _ = x.shape
    heads, kv_heads, dim = module.num_heads, module.num_kv_heads, module.head_dim

    def proj(name, heads_):
        y = x @ w[f"{name}.weight"].T + w[f"{name}.bias"]
        return y.view(batch, seq, heads_, dim).transpose(1, 2)

    q, k, v = proj("q_proj", heads), proj("k_proj", kv_heads), proj("v_proj", kv_heads)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
    keys = torch.arange(seq, device=x.device)
    hidden = (keys % kv_stride != 0)[None, :].expand(seq, seq)
    if causal:
        hidden = hidden | (keys[None, :] > keys[:, None])
    scores = scores.masked_fill(hidden, float("-inf"))
    out = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(batch, seq, heads * dim)
    return out @ w["out_proj.weight"].T + w["out_proj.bias"]


@pytest.mark.parametrize("heads,kv_heads,causal,kv_stride",
                         [(4, 4, False, 1), (4, 2, True, 1), (8, 1, False, 1), (4, 4, True, 3)])
def test_module_matches_float64_oracle_cpu(heads, kv_heads, causal, kv_stride):
    torch.manual_seed(0)
    module = samattn.nn.MultiheadAttention(32, heads, num_kv_heads=kv_heads, causal=causal,
                                           kv_stride=kv_stride, dtype=torch.float64)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    assert_close(module(x), oracle_mha(module, x, causal, kv_stride), torch.float64)


def test_module_matches_torch_multihead_attention_cpu():
    torch.manual_seed(1)
    ours = samattn.nn.MultiheadAttention(48, 6, dtype=torch.float64)
    theirs = torch.nn.MultiheadAttention(48, 6, batch_first=True, dtype=torch.float64)
    ours.load_from_torch(theirs)
    x = torch.randn(3, 10, 48, dtype=torch.float64)
    expected, _ = theirs(x, x, x, need_weights=False)
    assert_close(ours(x), expected, torch.float64)
    mask = torch.triu(torch.ones(10, 10, dtype=torch.bool), 1)
    expected, _ = theirs(x, x, x, need_weights=False, attn_mask=mask)
    assert_close(ours(x, causal=True), expected, torch.float64)


def test_cross_attention_shapes_cpu():
    module = samattn.nn.MultiheadAttention(16, 4, num_kv_heads=2, kdim=8, vdim=12,
                                           dtype=torch.float64)
    q = torch.randn(2, 5, 16, dtype=torch.float64)
    k = torch.randn(2, 7, 8, dtype=torch.float64)
    v = torch.randn(2, 7, 12, dtype=torch.float64)
    assert module(q, k, v).shape == (2, 5, 16)


def test_lower_right_causal_against_torch_with_a_cache_cpu():
    # New queries (the last 4 positions) against 11 keys, 7 of them cached: torch's module given
    # the bottom-right mask, ours causal="lower_right".
    torch.manual_seed(2)
    ours = samattn.nn.MultiheadAttention(32, 4, causal="lower_right", dtype=torch.float64)
    theirs = torch.nn.MultiheadAttention(32, 4, batch_first=True, dtype=torch.float64)
    ours.load_from_torch(theirs)
    sequence = torch.randn(2, 11, 32, dtype=torch.float64)
    new = sequence[:, 7:]
    hidden = torch.ones(4, 11, dtype=torch.bool).tril(7).logical_not()
    expected, _ = theirs(new, sequence, sequence, need_weights=False, attn_mask=hidden)
    assert_close(ours(new, sequence), expected, torch.float64)
    full, _ = theirs(sequence, sequence, sequence, need_weights=False,
                     attn_mask=torch.ones(11, 11, dtype=torch.bool).triu(1))
    assert_close(ours(new, sequence), full[:, 7:], torch.float64)


def _torch_masks(kind, batch, heads, seq_q, seq_k, gen):
    """torch.nn.MultiheadAttention's masks (True = hidden), key 0 always visible."""
    hidden = torch.rand(seq_q, seq_k, generator=gen) > 0.6
    hidden[:, 0] = False
    padding = torch.rand(batch, seq_k, generator=gen) > 0.6
    padding[:, 0] = False
    bias = torch.randn(seq_q, seq_k, generator=gen, dtype=torch.float64)
    per_head = torch.randn(batch * heads, seq_q, seq_k, generator=gen, dtype=torch.float64)
    return {"bool": dict(attn_mask=hidden),
            "float": dict(attn_mask=bias),
            "per_head": dict(attn_mask=per_head),
            "padding": dict(key_padding_mask=padding),
            "bool_and_padding": dict(attn_mask=hidden, key_padding_mask=padding),
            "float_and_padding": dict(attn_mask=bias, key_padding_mask=padding),
            "float_padding": dict(key_padding_mask=torch.zeros(batch, seq_k, dtype=torch.float64)
                                  .masked_fill(padding, float("-inf")))}[kind]


@pytest.mark.parametrize("kind", ["bool", "float", "per_head", "padding", "bool_and_padding",
                                  "float_and_padding", "float_padding"])
def test_masks_follow_torch_multihead_attention_cpu(kind):
    torch.manual_seed(3)
    ours = samattn.nn.MultiheadAttention(24, 3, dtype=torch.float64)
    theirs = torch.nn.MultiheadAttention(24, 3, batch_first=True, dtype=torch.float64)
    ours.load_from_torch(theirs)
    query = torch.randn(2, 6, 24, dtype=torch.float64)
    memory = torch.randn(2, 9, 24, dtype=torch.float64)
    masks = _torch_masks(kind, 2, 3, 6, 9, torch.Generator().manual_seed(4))
    expected, _ = theirs(query, memory, memory, need_weights=False, **masks)
    assert_close(ours(query, memory, **masks), expected, torch.float64)


def test_mask_shapes_are_checked():
    module = samattn.nn.MultiheadAttention(16, 4, dtype=torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"attn_mask must be \(L, S\) = \(5, 5\)"):
        module(x, attn_mask=torch.zeros(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"3-D attn_mask must be \(batch \* num_heads, L, S\)"):
        module(x, attn_mask=torch.zeros(4, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(batch, S\) = \(2, 5\)"):
        module(x, key_padding_mask=torch.zeros(5, 2, dtype=torch.bool))


@pytest.mark.parametrize("kwargs,message", [
    ({"embed_dim": 30, "num_heads": 4}, "multiple of num_heads"),
    ({"embed_dim": 32, "num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
    ({"embed_dim": 32, "num_heads": 4, "kv_stride": 0}, "kv_stride"),
])
def test_module_rejects_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        samattn.nn.MultiheadAttention(**kwargs)


def test_module_gradients_reach_every_parameter_cpu():
    torch.manual_seed(2)
    module = samattn.nn.MultiheadAttention(16, 4, num_kv_heads=2, causal=True,
                                           dtype=torch.float64)
    x = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    module(x).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert torch.autograd.gradcheck(lambda t: module(t), (x,))


def module_with_torch_sdpa(module, x, causal):
    """The module's forward with torch SDPA in place of samattn (same dtype, same layers)."""
    batch, seq, _ = x.shape
    q = module._split_heads(module.q_proj(x), module.num_heads)
    k = module._split_heads(module.k_proj(x), module.num_kv_heads)
    v = module._split_heads(module.v_proj(x), module.num_kv_heads)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           enable_gqa=True)
    return module.out_proj(out.transpose(1, 2).reshape(batch, seq, module.embed_dim))


def _train(module, x, target, steps=5):
    # Adam: its steps (~lr) exceed bf16's resolution of the weights, where plain SGD's would
    # round away and leave a bf16 model unchanged.
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x).float(), target.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_module_matches_oracle_and_trains(dtype):
    torch.manual_seed(3)
    module = samattn.nn.MultiheadAttention(128, 4, num_kv_heads=2, causal=True, device="cuda",
                                           dtype=dtype)
    x = torch.randn(2, 100, 128, device="cuda", dtype=dtype)
    expected = oracle_mha(module, x, True)
    got = module(x)
    if dtype == torch.float32:
        assert_close(got, expected, torch.float32, scale_floor=1.0)
    else:
        # bf16 projections round too: hold us to FlashAttention-3's rule against the same module
        # run with torch's own bf16 SDPA (at most twice its error against the float64 oracle).
        assert_close_tensor_core(got, expected, module_with_torch_sdpa(module, x, True), dtype)
    target = torch.randn_like(x)
    losses = _train(module, x, target)
    assert losses[-1] < losses[0], losses
