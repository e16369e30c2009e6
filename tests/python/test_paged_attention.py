"""samattn.paged_attention: new queries against a paged KV cache (vLLM's and FlashAttention's
block_table layout).

The pages are read back here with torch indexing (k_cache[block_table]) into a dense cache, and
the call must equal samattn.attention on that cache with cache_seqlens: on the CPU to the bit (the
fp64 reference gathers the pages itself), on a GPU against the fp64 reference under the
tensor-core rule, the decoding kernel reading the pages in place (page sizes of one tile, more,
less and not a power of two; pages shared between entries; NaN in the pages nobody lists) and
the gathered fallback for calls it does not take.
"""

from __future__ import annotations

import pytest
import torch

import samattn
from helpers import requires_cuda
from test_cache_seqlens import lengths_mask
from test_masks import check_forward


def paged_inputs(batch, heads_q, heads_kv, seqlen_q, page_size, pages_per_entry, dim, *,
                 dtype=torch.float64, device="cpu", seed=0):
    """q, a pool of pages (two spare ones NaN), a shuffled block table in which entries 0 and 1
    share their first page (a common prefix), and lengths from full to empty."""
    gen = torch.Generator().manual_seed(seed)
    pages = batch * pages_per_entry + 2
    q = torch.randn(batch, heads_q, seqlen_q, dim, generator=gen, dtype=torch.float64)
    k_cache = torch.randn(pages, page_size, heads_kv, dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(pages, page_size, heads_kv, dim, generator=gen, dtype=torch.float64)
    order = torch.randperm(pages, generator=gen)
    table = order[:batch * pages_per_entry].view(batch, pages_per_entry).to(torch.int32)
    if batch > 1:
        table[1, 0] = table[0, 0]
    spare = order[batch * pages_per_entry:]
    k_cache[spare] = float("nan")
    v_cache[spare] = float("nan")
    keys = pages_per_entry * page_size
    lengths = torch.tensor([keys, keys // 3 + 1, 0, 5][:batch], dtype=torch.int32)
    to = dict(dtype=dtype, device=device)
    return (q.to(**to), k_cache.to(**to), v_cache.to(**to), table.to(device),
            lengths.to(device))


def gathered(cache, table):
    """The dense (B, H, pages x page_size, D) cache the table describes, by torch indexing."""
    batch, columns = table.shape
    dense = cache[table.long().flatten()].view(batch, columns * cache.shape[1], cache.shape[2],
                                               cache.shape[3])
    return dense.transpose(1, 2)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("causal", [False, "lower_right", "upper_left"])
def test_cpu_equals_attention_on_the_gathered_cache(page_size, causal):
    q, k_cache, v_cache, table, lengths = paged_inputs(4, 4, 2, 3, page_size, 40 // page_size, 8)
    out, lse = samattn.paged_attention(q, k_cache, v_cache, table, lengths, causal=causal,
                                       return_lse=True)
    want, want_lse = samattn.attention(q, gathered(k_cache, table), gathered(v_cache, table),
                                       causal=causal, cache_seqlens=lengths, return_lse=True)
    assert torch.equal(out, want)
    assert torch.equal(lse, want_lse)
    assert not torch.isnan(out).any()


def test_errors_name_the_argument():
    q, k_cache, v_cache, table, lengths = paged_inputs(2, 2, 2, 1, 4, 3, 8)
    with pytest.raises(ValueError, match="takes causal=False, 'lower_right'"):
        samattn.paged_attention(q, k_cache, v_cache, table, lengths, causal=True)
    with pytest.raises(ValueError, match="block_table must be an int32"):
        samattn.paged_attention(q, k_cache, v_cache, table.long(), lengths)
    with pytest.raises(ValueError, match="key_cache must be a 4-D pool"):
        samattn.paged_attention(q, k_cache[0], v_cache, table, lengths)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] is 13"):
        samattn.paged_attention(q, k_cache, v_cache, table, torch.tensor([13, 2], dtype=torch.int32))
    bad = table.clone()
    bad[0, 1] = k_cache.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] is"):
        samattn.paged_attention(q, k_cache, v_cache, bad, lengths)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="not differentiable"):
        samattn.paged_attention(q, k_cache, v_cache, table, lengths)


def test_torch_compile_traces_paged_attention():
    q, k_cache, v_cache, table, lengths = paged_inputs(2, 4, 2, 1, 4, 5, 8)
    compiled = torch.compile(samattn.paged_attention, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, k_cache, v_cache, table, lengths),
                       samattn.paged_attention(q, k_cache, v_cache, table, lengths))


# ---- GPU --------------------------------------------------------------------------------------

GPU_CASES = {
    # (B, Hq, Hkv, Sq, page_size, pages per entry, D), causal, num_splits, decoding kernel
    "page_16_split": ((4, 8, 2, 1, 16, 60, 128), False, 0, True),
    "page_256_one_chunk": ((4, 8, 2, 1, 256, 4, 128), False, 1, True),
    "page_100_drafts": ((4, 8, 2, 4, 100, 8, 64), "lower_right", 4, True),
    "page_64_d256": ((3, 8, 1, 1, 64, 8, 256), False, 0, True),
    # 8 queries x 16 query heads per kv head: past the decoding kernel, gathered.
    "gathered_rows_past_the_kernel": ((4, 16, 1, 8, 32, 20, 64), "lower_right", 0, False),
}


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_matches_reference(name, dtype):
    (batch, heads_q, heads_kv, seqlen_q, page_size, pages, dim), causal, splits, in_place = \
        GPU_CASES[name]
    q, k_cache, v_cache, table, lengths = paged_inputs(batch, heads_q, heads_kv, seqlen_q,
                                                       page_size, pages, dim, dtype=dtype,
                                                       device="cuda", seed=3)
    out, lse = samattn.paged_attention(q, k_cache, v_cache, table, lengths, causal=causal,
                                       num_splits=splits, return_lse=True)
    assert not torch.isnan(out).any()
    k, v = gathered(k_cache, table), gathered(v_cache, table)
    detail = samattn.selected_backend(q, k, v, causal=causal, num_splits=splits, detail=True,
                                      cache_seqlens=lengths)
    assert ("decoding kernel" in detail) == in_place, detail
    visible = lengths_mask(lengths, seqlen_q, k.shape[2], lower_right=causal == "lower_right")
    check_forward(out, lse, q, k.nan_to_num(0.0), v.nan_to_num(0.0), {}, attn_mask=visible.cuda())
