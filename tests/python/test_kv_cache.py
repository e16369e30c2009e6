"""samattn.KVCache and samattn.PagedKVCache: ragged appends and attention against the cache.

Each entry's keys and values are also kept here as plain tensors (concatenated per entry), and
attending through a cache must equal samattn.attention on that entry's own keys: on the CPU (the
fp64 reference) to rounding; the dense and the paged cache to the bit against each other (both
read the same keys in the same order), including after an entry is freed and its pages reused.
On a GPU the same, in bfloat16, both caches on the decoding kernel.
"""

from __future__ import annotations

import pytest
import torch

import samattn
from helpers import requires_cuda
from test_cache_seqlens import lengths_mask
from test_masks import check_forward

HEADS_Q, HEADS_KV, DIM = 4, 2, 8


def new_tokens(batch, count, dtype, device, generator):
    shape = (batch, HEADS_KV, count, DIM)
    return (torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype=dtype,
                                                                            device=device)
            for _ in range(2))


def per_entry(q, keys, values, causal, counts=None):
    """Attention of each entry's real queries (its first counts[b] rows) against its own keys,
    one call per entry; rows past them (padding) are left 0."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        rows = q.shape[2] if counts is None else counts[b]
        out[b:b + 1, :, :rows] = samattn.attention(
            q[b:b + 1, :, :rows].double().cpu(), keys[b].double().cpu().unsqueeze(0),
            values[b].double().cpu().unsqueeze(0), causal=causal)
    return out


def real_rows(out, counts):
    """out with the padded query rows set to 0."""
    out = out.double().cpu().clone()
    for b, rows in enumerate(counts):
        out[b, :, rows:] = 0
    return out


def run_steps(caches, steps, dtype, device, seed=0):
    """Appends the same ragged prompts (queries right-padded like the keys) and decoding steps
    to every cache; returns each cache's outputs per step (padded rows zeroed) and the expected
    ones from the kept keys."""
    generator = torch.Generator().manual_seed(seed)
    batch = 3
    prompts = [5, 1, 3]
    keys = [torch.zeros(HEADS_KV, 0, DIM, dtype=dtype, device=device) for _ in range(batch)]
    values = [k.clone() for k in keys]
    got = [[] for _ in caches]
    want = []
    for step, count in enumerate([max(prompts)] + [1] * steps):
        k, v = new_tokens(batch, count, dtype, device, generator)
        q = torch.randn((batch, HEADS_Q, count, DIM), generator=generator,
                        dtype=torch.float64).to(dtype=dtype, device=device)
        counts = prompts if step == 0 else [count] * batch
        for b in range(batch):
            keys[b] = torch.cat([keys[b], k[b, :, :counts[b]]], dim=1)
            values[b] = torch.cat([values[b], v[b, :, :counts[b]]], dim=1)
        for i, cache in enumerate(caches):
            cache.append(k, v, counts)
            got[i].append(real_rows(cache.attend(q, causal="lower_right"), counts))
        want.append(per_entry(q, keys, values, "lower_right", counts))
    return got, want


def test_cpu_dense_and_paged_caches_equal_per_entry_attention():
    dense = samattn.KVCache(3, HEADS_KV, 12, DIM, dtype=torch.float64, device="cpu")
    paged = samattn.PagedKVCache(3, 12, 2, HEADS_KV, DIM, dtype=torch.float64, device="cpu")
    (got_dense, got_paged), want = run_steps([dense, paged], 4, torch.float64, "cpu")
    for a, b, w in zip(got_dense, got_paged, want):
        assert torch.equal(a, b)
        assert torch.allclose(a, w, rtol=1e-12, atol=1e-12)
    assert dense.lengths.tolist() == [9, 5, 7] == paged.lengths.tolist()


def test_cpu_freed_pages_are_reused():
    generator = torch.Generator().manual_seed(1)
    paged = samattn.PagedKVCache(2, 5, 2, HEADS_KV, DIM, dtype=torch.float64, device="cpu")
    k, v = new_tokens(2, 4, torch.float64, "cpu", generator)
    paged.append(k, v)  # 2 pages each: one page left, two needed for one more token each
    with pytest.raises(RuntimeError, match="out of pages"):
        paged.append(*new_tokens(2, 1, torch.float64, "cpu", generator))
    paged.free(0)
    assert paged.lengths.tolist() == [0, 4]
    # Entry 0 refills from the freed pages; entry 1 brings nothing (its rows are padding).
    k2, v2 = new_tokens(2, 3, torch.float64, "cpu", generator)
    paged.append(k2, v2, counts=[3, 0])
    q = torch.randn(2, HEADS_Q, 3, DIM, generator=generator, dtype=torch.float64)
    want = per_entry(q, [k2[0], k[1]], [v2[0], v[1]], "lower_right", counts=[3, 0])
    assert torch.allclose(real_rows(paged.attend(q), [3, 0]), want, rtol=1e-12, atol=1e-12)
    # One token each: both entries' keys, entry 0 on reused pages.
    k3, v3 = new_tokens(2, 1, torch.float64, "cpu", generator)
    paged.append(k3, v3)
    q = torch.randn(2, HEADS_Q, 1, DIM, generator=generator, dtype=torch.float64)
    keys = [torch.cat([k2[0], k3[0]], dim=1), torch.cat([k[1], k3[1]], dim=1)]
    values = [torch.cat([v2[0], v3[0]], dim=1), torch.cat([v[1], v3[1]], dim=1)]
    want = per_entry(q, keys, values, "lower_right")
    assert torch.allclose(paged.attend(q), want, rtol=1e-12, atol=1e-12)


def test_cpu_errors_name_the_limit():
    cache = samattn.KVCache(2, HEADS_KV, 4, DIM, dtype=torch.float64, device="cpu")
    generator = torch.Generator().manual_seed(2)
    with pytest.raises(ValueError, match="holds 4 tokens per entry"):
        cache.append(*new_tokens(2, 5, torch.float64, "cpu", generator))
    with pytest.raises(ValueError, match="counts must give 0..3 new tokens"):
        cache.append(*new_tokens(2, 3, torch.float64, "cpu", generator), counts=[4, 1])
    paged = samattn.PagedKVCache(1, 8, 2, HEADS_KV, DIM, max_pages_per_entry=2,
                                 dtype=torch.float64, device="cpu")
    with pytest.raises(ValueError, match=r"holds 4 tokens per entry \(max_pages_per_entry = 2\)"):
        paged.append(*new_tokens(1, 5, torch.float64, "cpu", generator))


@requires_cuda
def test_gpu_dense_and_paged_caches_agree_and_match_reference():
    # 128-wide heads, the decoding kernel's; the pool and the dense cache hold the same 64 keys
    # per entry, so both plan the same chunks and read the same keys in the same order. The
    # ragged prefill (80 query rows per kv head: past the decoding kernel) runs one call per
    # entry on the dense cache and on a gathered copy of the pages.
    dim, batch = 128, 3
    generator = torch.Generator().manual_seed(3)
    dense = samattn.KVCache(batch, HEADS_KV, 64, dim, dtype=torch.bfloat16, device="cuda")
    paged = samattn.PagedKVCache(batch, 12, 16, HEADS_KV, dim, max_pages_per_entry=4,
                                 dtype=torch.bfloat16, device="cuda")

    def randn(*shape):
        return torch.randn(shape, generator=generator).to(dtype=torch.bfloat16, device="cuda")

    for step, counts in enumerate([[40, 3, 17], None, None, None]):
        new = 40 if step == 0 else 1
        k, v = randn(batch, HEADS_KV, new, dim), randn(batch, HEADS_KV, new, dim)
        for cache in (dense, paged):
            cache.append(k, v, counts)
        q = randn(batch, HEADS_Q, new, dim)
        out, lse = dense.attend(q, num_splits=0, return_lse=True)
        real = counts or [new] * batch
        assert torch.equal(real_rows(paged.attend(q, num_splits=0), real), real_rows(out, real))
        # The dense cache attends over its written rows, the prefill's padding included.
        written = dense.lengths + torch.tensor([new - c for c in real], dtype=torch.int32,
                                               device="cuda")
        visible = lengths_mask(written, new, 64, lower_right=True)
        check_forward(out, lse, q, dense.k, dense.v, {}, attn_mask=visible.cuda())


@pytest.mark.parametrize("paged", [False, True])
def test_cpu_ragged_append_to_filled_entries_aligns_each_entry(paged):
    # Right-padded new tokens (counts) into entries that already hold keys: entry b's real
    # query t sees its cache and its new tokens up to t (the padding never).
    generator = torch.Generator().manual_seed(4)
    if paged:
        cache = samattn.PagedKVCache(2, 8, 3, HEADS_KV, DIM, dtype=torch.float64, device="cpu")
    else:
        cache = samattn.KVCache(2, HEADS_KV, 10, DIM, dtype=torch.float64, device="cpu")
    k0, v0 = new_tokens(2, 4, torch.float64, "cpu", generator)
    cache.append(k0, v0)
    k1, v1 = new_tokens(2, 3, torch.float64, "cpu", generator)
    counts = [3, 1]
    cache.append(k1, v1, counts)
    q = torch.randn(2, HEADS_Q, 3, DIM, generator=generator, dtype=torch.float64)
    out = cache.attend(q)
    for b, count in enumerate(counts):
        keys = torch.cat([k0[b], k1[b, :, :count]], dim=1).unsqueeze(0)
        values = torch.cat([v0[b], v1[b, :, :count]], dim=1).unsqueeze(0)
        alone = samattn.attention(q[b:b + 1, :, :count], keys, values, causal="lower_right")
        assert torch.allclose(out[b:b + 1, :, :count], alone, rtol=1e-12, atol=1e-12)
    assert cache.lengths.tolist() == [7, 5]


def test_cpu_a_failed_append_changes_nothing():
    generator = torch.Generator().manual_seed(5)
    paged = samattn.PagedKVCache(2, 3, 2, HEADS_KV, DIM, dtype=torch.float64, device="cpu")
    paged.append(*new_tokens(2, 2, torch.float64, "cpu", generator), counts=[1, 2])
    table, lengths = paged.block_table.clone(), paged.lengths.clone()
    with pytest.raises(RuntimeError, match="out of pages"):
        paged.append(*new_tokens(2, 2, torch.float64, "cpu", generator))
    with pytest.raises(ValueError, match="must be a torch.float64 tensor of shape"):
        paged.append(*new_tokens(2, 1, torch.float32, "cpu", generator))
    assert torch.equal(paged.block_table, table) and torch.equal(paged.lengths, lengths)
    assert len(paged._free) == 1


@pytest.mark.parametrize("paged", [False, True])
def test_cpu_multihead_attention_generates_with_a_cache(paged):
    # A prompt, then tokens one at a time through the module's cache, equals the module run
    # causally on the whole sequence, row for row.
    torch.manual_seed(6)
    module = samattn.nn.MultiheadAttention(32, 4, num_kv_heads=2, dtype=torch.float64)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    if paged:
        cache = samattn.PagedKVCache(2, 8, 2, 2, 8, dtype=torch.float64, device="cpu")
    else:
        cache = samattn.KVCache(2, 2, 7, 8, dtype=torch.float64, device="cpu")
    with pytest.raises(RuntimeError, match="KV caches are for inference"):
        module(x[:, :4], kv_cache=cache)
    with torch.no_grad():
        outs = [module(x[:, :4], kv_cache=cache)]
        outs += [module(x[:, t:t + 1], kv_cache=cache) for t in range(4, 7)]
        want = module(x, causal=True)
        assert torch.allclose(torch.cat(outs, dim=1), want, rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match="kv_cache takes self-attention"):
            module(x[:, :1], x[:, :1], kv_cache=cache)
