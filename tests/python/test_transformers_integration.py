"""attn_implementation="samattn" in Hugging Face transformers: a tiny Llama-style model built from
a config (random weights, no download) gives the outputs and gradients of the "sdpa"
implementation. Skips where transformers is not installed."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_close, requires_cuda

transformers = pytest.importorskip("transformers")

from samattn.integrations import transformers as samattn_hf  # noqa: E402


def tiny_llama(implementation: str, dtype: torch.dtype, device: str, seed: int = 0):
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        attention_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)
    model.set_attn_implementation(implementation)
    return model


def logits_and_grads(model, tokens, attention_mask=None):
    model.zero_grad()
    logits = model(input_ids=tokens, attention_mask=attention_mask).logits
    logits.float().square().mean().backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return logits.detach(), grads


def compare(dtype: torch.dtype, device: str, scale_floor: float):
    samattn_hf.register()
    ours = tiny_llama("samattn", dtype, device)
    theirs = tiny_llama("sdpa", dtype, device)
    assert ours.config._attn_implementation == "samattn"
    tokens = torch.randint(0, 256, (2, 77), generator=torch.Generator().manual_seed(1)).to(device)
    got_logits, got_grads = logits_and_grads(ours, tokens)
    ref_logits, ref_grads = logits_and_grads(theirs, tokens)
    assert_close(got_logits, ref_logits, dtype, scale_floor=scale_floor)
    for name, ref in ref_grads.items():
        assert_close(got_grads[name], ref, dtype, scale_floor=scale_floor)


def test_registered_name_is_used(monkeypatch):
    samattn_hf.register()
    model = tiny_llama("samattn", torch.float64, "cpu")
    calls = []
    original = samattn_hf.samattn_attention_forward

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    transformers.AttentionInterface.register("samattn", spy)
    try:
        model(input_ids=torch.randint(0, 256, (1, 9)))
    finally:
        samattn_hf.register()
    assert len(calls) == model.config.num_hidden_layers


def test_cpu_float64_matches_sdpa():
    # The CPU path is samattn's float64 reference: logits and every gradient agree with
    # transformers' sdpa implementation to float64 rounding.
    compare(torch.float64, "cpu", scale_floor=1.0)


def test_decoding_with_cache_matches_sdpa():
    samattn_hf.register()
    ours = tiny_llama("samattn", torch.float64, "cpu")
    theirs = tiny_llama("sdpa", torch.float64, "cpu")
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    got = ours.generate(tokens, max_new_tokens=6, do_sample=False, output_logits=True,
                        return_dict_in_generate=True)
    ref = theirs.generate(tokens, max_new_tokens=6, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.logits, ref.logits):
        assert_close(a, b, torch.float64, scale_floor=1.0)


def test_decoding_with_split_keys_matches_sdpa(monkeypatch):
    # register(num_splits=0): the unmasked calls (the decoding steps) ask samattn to split the
    # keys; the generated tokens and logits stay sdpa's. On the CPU this checks the plumbing (the
    # reference ignores num_splits); the split kernels are checked by test_key_split.py.
    device = "cpu"
    seen = []
    original = samattn_hf.attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("num_splits"))
        return original(*args, **kwargs)

    monkeypatch.setattr(samattn_hf, "attention", spy)
    dtype = torch.float64
    samattn_hf.register(num_splits=0)
    try:
        ours = tiny_llama("samattn", dtype, device)
        theirs = tiny_llama("sdpa", dtype, device)
        tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(4))
        got = ours.generate(tokens.to(device), max_new_tokens=5, do_sample=False,
                            output_logits=True, return_dict_in_generate=True)
        ref = theirs.generate(tokens.to(device), max_new_tokens=5, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
    finally:
        samattn_hf.register()
    assert seen and all(n == 0 for n in seen)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.logits, ref.logits):
        assert_close(a, b, dtype, scale_floor=1.0)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32])
def test_gpu_matches_sdpa(dtype):
    # float32 runs IEEE on both sides (SDPA's efficient/math kernels, samattn's SIMT kernels).
    compare(dtype, "cuda", scale_floor=1.0)


@requires_cuda
def test_gpu_bfloat16_close_to_float64():
    # bf16 end to end: both implementations are held against the same model in float64; ours may
    # be at most twice as far from it as transformers' sdpa in bf16 (FlashAttention-3's rule).
    samattn_hf.register()
    tokens = torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(3)).cuda()
    exact, _ = logits_and_grads(tiny_llama("sdpa", torch.float64, "cuda"), tokens)
    ours, _ = logits_and_grads(tiny_llama("samattn", torch.bfloat16, "cuda"), tokens)
    theirs, _ = logits_and_grads(tiny_llama("sdpa", torch.bfloat16, "cuda"), tokens)
    err_ours = (ours.double() - exact).abs().max().item()
    err_theirs = (theirs.double() - exact).abs().max().item()
    assert torch.isfinite(ours).all()
    assert err_ours <= 2 * err_theirs + 2.0**-8 * exact.abs().max().item(), (err_ours, err_theirs)


def test_padded_batch_matches_sdpa_on_real_tokens():
    # Left padding: transformers builds a boolean 4-D mask, which samattn applies as attn_mask.
    # Padding query rows see no key (samattn: 0, sdpa: transformers' fix-up), so only the real
    # tokens' logits are compared.
    samattn_hf.register()
    ours = tiny_llama("samattn", torch.float64, "cpu")
    theirs = tiny_llama("sdpa", torch.float64, "cpu")
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(4))
    attention_mask = torch.ones(2, 20, dtype=torch.long)
    attention_mask[1, :7] = 0
    got = ours(input_ids=tokens, attention_mask=attention_mask).logits
    ref = theirs(input_ids=tokens, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    assert_close(got[real], ref[real], torch.float64, scale_floor=1.0)


def test_padded_generation_with_split_keys_matches_sdpa(monkeypatch):
    # register(num_splits=0) with left padding: the masked calls go to samattn.attention with
    # the split option (plumbing on the CPU, where the reference ignores it); the real tokens'
    # generation stays sdpa's.
    seen = []
    original = samattn_hf.attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("num_splits"), kwargs.get("attn_mask") is not None))
        return original(*args, **kwargs)

    monkeypatch.setattr(samattn_hf, "attention", spy)
    samattn_hf.register(num_splits=0)
    try:
        ours = tiny_llama("samattn", torch.float64, "cpu")
        theirs = tiny_llama("sdpa", torch.float64, "cpu")
        tokens = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(5))
        attention_mask = torch.ones(2, 10, dtype=torch.long)
        attention_mask[1, :3] = 0
        kwargs = dict(attention_mask=attention_mask, max_new_tokens=4, do_sample=False,
                      output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        got = ours.generate(tokens, **kwargs)
        ref = theirs.generate(tokens, **kwargs)
    finally:
        samattn_hf.register()
    assert any(masked for _, masked in seen) and all(n == 0 for n, _ in seen)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.logits, ref.logits):
        assert_close(a, b, torch.float64, scale_floor=1.0)
