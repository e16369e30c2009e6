"""KV caches for generation: one layer's keys and values, preallocated, with each batch entry's
length, appended to in place and attended to with samattn's kernels.

KVCache keeps a dense (B, max_len, Hkv, D) cache (the (B, S, H, D) layout a model writes) and
attends through ``samattn.attention(..., cache_seqlens=...)``; PagedKVCache keeps a pool of pages
(vLLM's layout) with a block table and a free list, and attends through
``samattn.paged_attention``.

Both take ragged appends: ``append(k, v, counts)`` with (B, Hkv, T, D) new keys and values of
which entry b brings only the first counts[b] (the rest is padding, as in a batch of prompts of
different lengths). ``attend(q)`` then runs the appended tokens' (B, Hq, T, D) queries, padded the
same way, bottom-right causal by default: entry b's real query t sees its cache and its new
tokens up to itself. The padding's keys lie past each entry's length, where the next append
writes over them; the padded queries' outputs are to be ignored. Lengths are kept on the host as
well, so an append past the capacity raises, before anything changes, without reading the GPU
back; they reach the device through pinned memory without a synchronisation. Inference only:
append raises when autograd would record it (the buffers are written in place).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from samattn.functional import attention, paged_attention

Tensor = torch.Tensor
_CAUSAL = (False, "lower_right", "upper_left")


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


def _check_new(k: Tensor, v: Tensor, like_k: Tensor, like_v: Tensor, batch: int,
               counts: Optional[Sequence[int]]) -> List[int]:
    """Checks new keys and values against the cache (the heads and head dims of its last two
    dimensions, dtype, device) and returns each entry's count of real tokens."""
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        raise RuntimeError("samattn: KV caches are for inference (their buffers are written in "
                           "place); append under torch.no_grad() or torch.inference_mode()")
    heads, dim, dim_v = like_k.shape[-2], like_k.shape[-1], like_v.shape[-1]
    for name, t, d in (("k", k, dim), ("v", v, dim_v)):
        if (t.dim() != 4 or tuple(t.shape[:2]) != (batch, heads) or t.shape[3] != d
                or t.shape[2] != k.shape[2] or t.dtype != like_k.dtype
                or t.device != like_k.device):
            raise ValueError(f"samattn: {name} must be a {like_k.dtype} tensor of shape "
                             f"({batch}, {heads}, T, {d}) on {like_k.device}, got {t.dtype} "
                             f"{tuple(t.shape)} on {t.device}")
    new = k.shape[2]
    if counts is None:
        return [new] * batch
    counts = [int(c) for c in counts]
    if len(counts) != batch or any(c < 0 or c > new for c in counts):
        raise ValueError(f"samattn: counts must give 0..{new} new tokens for each of the {batch} "
                         f"batch entries, got {counts}")
    return counts


def _check_causal(causal) -> None:
    if not any(causal is c or causal == c for c in _CAUSAL):
        raise ValueError("samattn: a cache attends with causal=False, 'lower_right' or "
                         f"'upper_left', got {causal!r}")


class KVCache:
    """A dense preallocated cache: entry b's keys are the first ``lengths[b]`` rows (see the
    module's docstring for append and attend)."""

    def __init__(self, batch: int, heads_kv: int, max_len: int, head_dim: int,
                 head_dim_v: Optional[int] = None, *, dtype=torch.bfloat16,
                 device: Union[str, torch.device] = "cuda"):
        head_dim_v = head_dim if head_dim_v is None else head_dim_v
        self.max_len = max_len
        self._k = torch.zeros(batch, max_len, heads_kv, head_dim, dtype=dtype, device=device)
        self._v = torch.zeros(batch, max_len, heads_kv, head_dim_v, dtype=dtype, device=device)
        self._host_lengths = [0] * batch
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        # The keys the last append's queries attend over: its padding included, so that a
        # right-padded entry's real queries align to the end of its written rows.
        self._visible = torch.zeros(batch, dtype=torch.int32, device=device)

    @property
    def k(self) -> Tensor:
        """The keys as a (B, Hkv, max_len, D) view."""
        return self._k.transpose(1, 2)

    @property
    def v(self) -> Tensor:
        return self._v.transpose(1, 2)

    def append(self, k: Tensor, v: Tensor, counts: Optional[Sequence[int]] = None) -> None:
        batch = len(self._host_lengths)
        counts = _check_new(k, v, self._k, self._v, batch, counts)
        heads, new = k.shape[1], k.shape[2]
        # The padding is written too (past the entry's length): it must fit.
        if any(length + new > self.max_len for length in self._host_lengths):
            raise ValueError(f"samattn: KVCache holds {self.max_len} tokens per entry; appending "
                             f"{new} to lengths {self._host_lengths} would pass it")
        start = self.lengths.long().view(batch, 1, 1, 1)
        rows = start + torch.arange(new, device=k.device).view(1, new, 1, 1)
        self._k.scatter_(1, rows.expand(batch, new, heads, k.shape[-1]), k.transpose(1, 2))
        self._v.scatter_(1, rows.expand(batch, new, heads, v.shape[-1]), v.transpose(1, 2))
        _copy_from_host(self._visible, [length + new for length in self._host_lengths])
        self._host_lengths = [length + c for length, c in zip(self._host_lengths, counts)]
        _copy_from_host(self.lengths, self._host_lengths)

    def attend(self, q: Tensor, *, causal: Union[bool, str] = "lower_right",
               scale: Optional[float] = None, num_splits: int = 1, return_lse: bool = False):
        _check_causal(causal)
        return attention(q, self.k, self.v, causal=causal, scale=scale, num_splits=num_splits,
                         return_lse=return_lse, cache_seqlens=self._visible)


class PagedKVCache:
    """A paged cache: a pool of ``num_pages`` pages of ``page_size`` rows shared by the entries,
    each entry's pages listed in ``block_table`` (B, max_pages_per_entry; by default as wide as
    the pool, which a call the decoding kernel does not take gathers whole), pages taken from a
    free list as an entry grows and returned by ``free(b)``. append and attend as KVCache's (see
    the module's docstring); the padding of a ragged append is not written (it gets no pages).
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
        self._host_visible = [0] * batch
        self.block_table = torch.zeros(batch, self.max_pages, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self._visible = torch.zeros(batch, dtype=torch.int32, device=device)

    def _pages_for(self, rows: int) -> int:
        return -(-rows // self.page_size)

    def _sync_tables(self) -> None:
        table = torch.zeros(len(self._pages), self.max_pages, dtype=torch.int32)
        for b, pages in enumerate(self._pages):
            table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        _copy_from_host(self.block_table, table)
        _copy_from_host(self.lengths, self._host_lengths)

    def append(self, k: Tensor, v: Tensor, counts: Optional[Sequence[int]] = None) -> None:
        batch = len(self._host_lengths)
        counts = _check_new(k, v, self.k_pages, self.v_pages, batch, counts)
        heads, new = k.shape[1], k.shape[2]
        # Every check before anything changes. The padding is not written (only its queries,
        # whose outputs are ignored, see past the real rows), but the attended lengths include
        # it: they must fit the table.
        capacity = self.max_pages * self.page_size
        if any(length + new > capacity for length in self._host_lengths):
            raise ValueError(f"samattn: PagedKVCache holds {capacity} tokens per entry "
                             f"(max_pages_per_entry = {self.max_pages}); appending {new} to "
                             f"lengths {self._host_lengths} would pass it")
        needed = [self._pages_for(length + c) for length, c in zip(self._host_lengths, counts)]
        missing = sum(max(0, n - len(p)) for n, p in zip(needed, self._pages))
        if missing > len(self._free):
            raise RuntimeError(f"samattn: PagedKVCache is out of pages ({missing} needed, "
                               f"{len(self._free)} free)")
        rows, sources = [], []
        for b, count in enumerate(counts):
            while len(self._pages[b]) < needed[b]:
                self._pages[b].append(self._free.pop())
            start = self._host_lengths[b]
            positions = torch.arange(start, start + count)
            pages = torch.tensor(self._pages[b], dtype=torch.long)[positions // self.page_size]
            rows.append(pages * self.page_size + positions % self.page_size)
            sources.append(b * new + torch.arange(count))
        rows_t, sources_t = torch.cat(rows), torch.cat(sources)
        if rows_t.numel() > 0:
            device = self.k_pages.device
            rows_t, sources_t = _to_device(rows_t, device), _to_device(sources_t, device)
            for pool, values in ((self.k_pages, k), (self.v_pages, v)):
                flat = values.transpose(1, 2).reshape(batch * new, heads, values.shape[-1])
                pool.view(-1, heads, pool.shape[-1]).index_copy_(0, rows_t,
                                                                 flat.index_select(0, sources_t))
        self._host_visible = [length + new for length in self._host_lengths]
        _copy_from_host(self._visible, self._host_visible)
        self._host_lengths = [length + c for length, c in zip(self._host_lengths, counts)]
        self._sync_tables()

    def free(self, b: int) -> None:
        """Empties entry b and returns its pages to the pool."""
        self._free.extend(self._pages[b])
        self._pages[b] = []
        self._host_lengths[b] = 0
        self._host_visible[b] = 0
        _copy_from_host(self._visible, self._host_visible)
        self._sync_tables()

    def attend(self, q: Tensor, *, causal: Union[bool, str] = "lower_right",
               scale: Optional[float] = None, num_splits: int = 1, return_lse: bool = False):
        _check_causal(causal)
        return paged_attention(q, self.k_pages, self.v_pages, self.block_table, self._visible,
                               causal=causal, scale=scale, num_splits=num_splits,
                               return_lse=return_lse)
