"""KV caches for generation: one layer's keys and values, preallocated, with each batch entry's
length, appended to in place and attended to with samattn's kernels.

KVCache keeps a dense (B, max_len, Hkv, D) cache (the (B, S, H, D) layout a model writes) and
attends through ``samattn.attention(..., cache_seqlens=...)``; PagedKVCache keeps a pool of pages
(vLLM's layout) with a block table and a free list, and attends through
``samattn.paged_attention``. Both take ragged appends (a different number of new tokens per entry,
e.g. the prompts of a batch) and keep the lengths on the host as well, so that an append past
the capacity raises without reading the GPU back.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from samattn.functional import attention, paged_attention

Tensor = torch.Tensor


def _copy_from_host(dst: Tensor, values) -> None:
    """dst <- values (host), without synchronising a CUDA device: through pinned memory, which
    torch's host allocator keeps until the copy has run."""
    src = torch.as_tensor(values, dtype=dst.dtype)
    if dst.is_cuda:
        src = src.pin_memory()
    dst.copy_(src, non_blocking=dst.is_cuda)


def _to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor on `device`, without synchronising it (pinned memory, as above)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _new_counts(counts: Optional[Sequence[int]], batch: int, new: int) -> List[int]:
    """The new tokens of each entry: all `new` by default, else the given counts (<= new)."""
    if counts is None:
        return [new] * batch
    counts = [int(c) for c in counts]
    if len(counts) != batch or any(c < 0 or c > new for c in counts):
        raise ValueError(f"samattn: counts must give 0..{new} new tokens for each of the {batch} "
                         f"batch entries, got {counts}")
    return counts


class KVCache:
    """A dense preallocated cache: entry b's keys are the first ``lengths[b]`` rows.

    append(k, v) writes (B, Hkv, T, D) new keys and values after each entry's current length
    (``counts`` can say that entry b brings only counts[b] of the T: the rest, padding, is written
    past its length and never read). attend(q) runs attention of (B, Hq, Tq, D) queries against the
    cache, by default bottom-right causal: the new tokens sit at the end of each entry.
    """

    def __init__(self, batch: int, heads_kv: int, max_len: int, head_dim: int,
                 head_dim_v: Optional[int] = None, *, dtype=torch.bfloat16,
                 device: Union[str, torch.device] = "cuda"):
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        self.max_len = max_len
        self._k = torch.zeros(batch, max_len, heads_kv, head_dim, dtype=dtype, device=device)
        self._v = torch.zeros(batch, max_len, heads_kv, head_dim_v, dtype=dtype, device=device)
        self._host_lengths = [0] * batch
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)

    @property
    def k(self) -> Tensor:
        """The keys as a (B, Hkv, max_len, D) view."""
        return self._k.transpose(1, 2)

    @property
    def v(self) -> Tensor:
        return self._v.transpose(1, 2)

    def append(self, k: Tensor, v: Tensor, counts: Optional[Sequence[int]] = None) -> None:
        batch, heads, new, _ = k.shape
        counts = _new_counts(counts, batch, new)
        if any(length + new > self.max_len for length in self._host_lengths):
            raise ValueError(f"samattn: KVCache holds {self.max_len} tokens per entry; appending "
                             f"{new} to lengths {self._host_lengths} would pass it")
        start = self.lengths.long().view(batch, 1, 1, 1)
        rows = start + torch.arange(new, device=k.device).view(1, new, 1, 1)
        self._k.scatter_(1, rows.expand(batch, new, heads, k.shape[-1]), k.transpose(1, 2))
        self._v.scatter_(1, rows.expand(batch, new, heads, v.shape[-1]), v.transpose(1, 2))
        self._host_lengths = [length + c for length, c in zip(self._host_lengths, counts)]
        _copy_from_host(self.lengths, self._host_lengths)

    def attend(self, q: Tensor, *, causal: Union[bool, str] = "lower_right",
               scale: Optional[float] = None, num_splits: int = 1, return_lse: bool = False):
        return attention(q, self.k, self.v, causal=causal, scale=scale, num_splits=num_splits,
                         return_lse=return_lse, cache_seqlens=self.lengths)


class PagedKVCache:
    """A paged cache: a pool of ``num_pages`` pages of ``page_size`` rows shared by the entries,
    each entry's pages listed in ``block_table`` (B, max_pages_per_entry), pages taken from a free
    list as an entry grows and returned by ``free(b)``.

    append and attend as KVCache's (attend: ``samattn.paged_attention``, so causal is False or
    "lower_right").
    """

    def __init__(self, batch: int, num_pages: int, page_size: int, heads_kv: int, head_dim: int,
                 head_dim_v: Optional[int] = None, *, max_pages_per_entry: Optional[int] = None,
                 dtype=torch.bfloat16, device: Union[str, torch.device] = "cuda"):
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        self.page_size = page_size
        self.k_pages = torch.zeros(num_pages, page_size, heads_kv, head_dim, dtype=dtype,
                                   device=device)
        self.v_pages = torch.zeros(num_pages, page_size, heads_kv, head_dim_v, dtype=dtype,
                                   device=device)
        self.max_pages = num_pages if max_pages_per_entry is None else max_pages_per_entry
        self._free = list(range(num_pages))
        self._pages: List[List[int]] = [[] for _ in range(batch)]
        self._host_lengths = [0] * batch
        self.block_table = torch.zeros(batch, self.max_pages, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)

    def _grow(self, b: int, length: int) -> None:
        needed = -(-length // self.page_size)
        if needed > self.max_pages:
            raise ValueError(f"samattn: entry {b} would need {needed} pages, past "
                             f"max_pages_per_entry = {self.max_pages}")
        while len(self._pages[b]) < needed:
            if not self._free:
                raise RuntimeError("samattn: PagedKVCache is out of pages")
            self._pages[b].append(self._free.pop())

    def _sync_tables(self) -> None:
        table = torch.zeros(len(self._pages), self.max_pages, dtype=torch.int32)
        for b, pages in enumerate(self._pages):
            table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        _copy_from_host(self.block_table, table)
        _copy_from_host(self.lengths, self._host_lengths)

    def append(self, k: Tensor, v: Tensor, counts: Optional[Sequence[int]] = None) -> None:
        batch, heads, new, _ = k.shape
        counts = _new_counts(counts, batch, new)
        rows, sources = [], []
        for b, count in enumerate(counts):
            start = self._host_lengths[b]
            self._grow(b, start + count)
            positions = torch.arange(start, start + count)
            pages = torch.tensor(self._pages[b], dtype=torch.long)[positions // self.page_size]
            rows.append(pages * self.page_size + positions % self.page_size)
            sources.append(b * new + torch.arange(count))
            self._host_lengths[b] = start + count
        self._sync_tables()
        rows_t, sources_t = torch.cat(rows), torch.cat(sources)
        if rows_t.numel() == 0:
            return
        device = self.k_pages.device
        rows_t, sources_t = _to_device(rows_t, device), _to_device(sources_t, device)
        for pool, values in ((self.k_pages, k), (self.v_pages, v)):
            flat = values.transpose(1, 2).reshape(batch * new, heads, values.shape[-1])
            pool.view(-1, heads, pool.shape[-1]).index_copy_(0, rows_t,
                                                             flat.index_select(0, sources_t))

    def free(self, b: int) -> None:
        """Empties entry b and returns its pages to the pool."""
        self._free.extend(self._pages[b])
        self._pages[b] = []
        self._host_lengths[b] = 0
        self._sync_tables()

    def attend(self, q: Tensor, *, causal: Union[bool, str] = "lower_right",
               scale: Optional[float] = None, num_splits: int = 1, return_lse: bool = False):
        return paged_attention(q, self.k_pages, self.v_pages, self.block_table, self.lengths,
                               causal=causal, scale=scale, num_splits=num_splits,
                               return_lse=return_lse)
