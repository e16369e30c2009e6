"""The attention functions: samattn's native entry point, a drop-in for
torch.nn.functional.scaled_dot_product_attention, and the names the seed projects used."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from samattn._ops import ops

Tensor = torch.Tensor


def _window_pair(window: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    if window is None:
        return -1, -1
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError("samattn: window must be a pair (left, right) of ints (-1 = unbounded), "
                         f"got {window!r}") from None
    return int(left), int(right)


_CAUSAL_NAMES = ("upper_left", "lower_right")


def _causal_is_lower_right(causal) -> bool:
    """Whether a causal argument (a bool, "upper_left" or "lower_right") is bottom-right."""
    if isinstance(causal, str):
        if causal not in _CAUSAL_NAMES:
            raise ValueError(f"samattn: causal must be a bool, 'upper_left' or 'lower_right', "
                             f"got {causal!r}")
        return causal == "lower_right"
    return False


class _CausalPlan:
    """How a call's causal option runs on the kernels' top-left causal and window: lower-right
    causal (torch's CausalVariant.LOWER_RIGHT, FlashAttention-2's causal=True) sees keys
    j <= i + seqlen_k - seqlen_q. With seqlen_k >= seqlen_q that is a window whose right edge is
    seqlen_k - seqlen_q; otherwise the first seqlen_q - seqlen_k query rows see no key (output 0,
    lse -inf) and the remaining rows are top-left causal, so they run as one call on q's
    trailing rows, with a window's left edge moved by the rows skipped."""

    def __init__(self, causal, seqlen_q: int, seqlen_k: int, left: int, right: int):
        lower_right = _causal_is_lower_right(causal)
        self.causal = bool(causal)
        self.seqlen_q = seqlen_q
        self.left, self.right = left, right
        self.empty_rows = 0       # leading query rows that see no key
        self.all_empty = False    # every row sees no key
        if not lower_right:
            return
        offset = seqlen_k - seqlen_q
        if offset == 0:  # the two alignments agree: the causal kernels run
            return
        if offset > 0:
            self.causal = False
            # One query row (decoding) sees every key: no window, so no mask option at all.
            if seqlen_q > 1 or right >= 0:
                self.right = offset if right < 0 else min(right, offset)
            return
        self.empty_rows = min(-offset, seqlen_q)
        # Trailing row r is query empty_rows + r: it sees keys j <= r, and the window's
        # i - left <= j becomes r - (left - empty_rows) <= j.
        if left >= 0:
            self.left = left - self.empty_rows
            self.all_empty = self.left < 0
        self.right = -1  # the causal edge r is below the window's r + empty_rows + right

    @property
    def first_row(self) -> int:
        """The first query row the call computes (the rows before it see no key)."""
        return self.seqlen_q if self.all_empty else self.empty_rows

    @property
    def window(self) -> Optional[Tuple[int, int]]:
        """The window option of the call on rows first_row.. (None: no window)."""
        if self.all_empty or (self.left, self.right) == (-1, -1):
            return None
        return self.left, self.right


def _rows_from(t: Optional[Tensor], first: int, rows: int) -> Optional[Tensor]:
    # A mask's query rows from `first` on, unless it broadcasts over them.
    if t is None or t.dim() < 2 or t.shape[-2] == 1:
        return t
    if t.shape[-2] != rows:
        raise ValueError(f"samattn: attn_mask's query dimension is {t.shape[-2]}, expected "
                         f"{rows} (seqlen_q) or 1")
    return t[..., first:, :]


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: Union[bool, str] = False,
              scale: Optional[float] = None, kv_stride: int = 1, return_lse: bool = False,
              backend: str = "auto", attn_mask: Optional[Tensor] = None,
              window: Optional[Tuple[int, int]] = None, sparse_pattern: str = "none",
              sparse_block: int = 0, sparse_summary: int = 0, block_sparse=None,
              num_splits: int = 1, cache_seqlens: Optional[Tensor] = None,
              window_follows_causal: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Fused attention on (batch, heads, seq_len, head_dim) tensors.

    q: (B, Hq, Sq, D); k: (B, Hkv, Sk, D); v: (B, Hkv, Sk, Dv) with Hq a multiple of Hkv
    (grouped-query attention). Any strides are accepted as long as the last dimension is
    contiguous, so (B, S, H, D) tensors can be passed as ``x.transpose(1, 2)`` without a copy.

    causal: True or "upper_left": query i sees keys j <= i (top-left aligned, like SDPA's
    ``is_causal``). "lower_right": query i sees keys j <= i + Sk - Sq (bottom-right aligned:
    torch's ``causal_lower_right``, FlashAttention-2's ``causal=True``; the last query sees every
    key, as when new queries attend to a KV cache); it runs as a window whose right edge is
    Sk - Sq, and with Sq > Sk the first Sq - Sk rows see no key (output 0, lse -inf). It does not
    combine with sparse_pattern (causal by definition), nor, when Sq > Sk, with block_sparse.
    scale: multiplies q.k; default 1/sqrt(D).
    kv_stride: strided attention, query i sees only keys j with j % kv_stride == 0.
    return_lse: also return the natural-log log-sum-exp of each row, (B, Hq, Sq), float32
    (float64 for float64 inputs); a row that sees no key has lse -inf and output 0.
    backend: "auto" (fastest available), "simt", "tensor_core" (sm80+ mma.sync) or
    "hopper" (sm_90a wgmma + TMA; fp16/bf16 on compute capability 9.0). Calls with attn_mask,
    window, a sparse pattern or block_sparse run on the tensor-core masked kernel for float16 and
    bfloat16 (also under "hopper", which takes, with kv_stride 1 and without attn_mask or a
    sparse pattern, a window, block_sparse whose block_q is a multiple of 64 and block_k of its
    key block (128; 80 at head dim 256) up to 64k keys, and varlen_attention's packed batches:
    such calls run the Hopper forward on compute capability 9.0) and on SIMT otherwise;
    "tensor_core" raises, naming the reason, when the tensor cores cannot run the call. The
    "fixed" sparse pattern (without window, kv_stride, attn_mask or block_sparse) runs there as
    a decomposition: its summary columns gathered into one call of the Hopper forward, its own
    blocks on the tensor-core masked kernel, merged in one softmax ("auto" or "hopper").

    Masks (all combine with causal and kv_stride; a key is visible when every option allows it):
    attn_mask: boolean (True = attend, SDPA's meaning) or additive float (bool, float32 or q's
    dtype), broadcastable to (B, Hq, Sq, Sk); any strides, broadcast dimensions cost nothing.
    Not differentiable (no gradient flows into it).
    window: (left, right): query i sees keys i - left <= j <= i + right; -1 = unbounded.
    window_follows_causal (with causal="lower_right"): the window follows the bottom-right
    diagonal instead, as FlashAttention's window_size does: query i sees
    i + Sk - Sq - left <= j <= i + Sk - Sq + right (Sk each entry's cache_seqlens when given).
    sparse_pattern: Sparse Transformer patterns (Child et al., 2019), causal by definition:
    "strided" (query i sees j <= i with i - j < sparse_block or (i - j) % sparse_block == 0) and
    "fixed" (j in i's block of sparse_block positions, or among the last sparse_summary positions
    of any block).

    block_sparse: a samattn.BlockSparse (FlexAttention's kv_num_blocks / kv_indices per
    (batch, head, query block), block sizes block_q x block_k): only listed key blocks are
    computed; attn_mask, if given, applies inside them. See samattn.block_sparse_from_mask and
    samattn.block_sparse_from_pattern.

    num_splits: split-key attention (flash-decoding), for calls with too few query blocks to fill
    the GPU, e.g. decoding (a few queries per head against a long KV cache): the keys are cut into
    chunks run as separate thread blocks, whose fp32 partial results one more kernel merges. 1
    (default): never; 0: automatic (when the query blocks leave SMs idle and there are enough keys
    to share); n > 1: about n chunks. Only float16/bfloat16 CUDA calls that the tensor-core kernels
    can run split, without causal=True or mask options other than attn_mask and a window's right
    edge (so causal="lower_right", new queries against a cache, and padded batches' masks split);
    others run as with 1. Calls with at most 64 query rows per key/value head (query heads per kv
    head x queries), head dim 64, 96, 128, 192 or 256, no kv_stride, no attn_mask but a key mask
    (the same for every head and query) run on a kernel shaped for decoding, which with 0 also runs
    unsplit where the (batch, kv head) pairs fill the GPU. Off by default: the first timing lost to
    SDPA on most decode shapes, and the decoding kernel is not yet timed (see the README's Known
    gaps).

    cache_seqlens: per-entry key lengths (FlashAttention's ``cache_seqlens``), an int32 tensor
    of B entries on the inputs' device: batch entry b's keys are the first cache_seqlens[b] rows
    of its k and v (0 <= value <= Sk: a KV cache allocated for Sk keys and filled to a different
    length per entry); the rows past it are never read and get zero gradients. With
    causal="lower_right" each entry aligns to its own length (query i sees keys
    j <= i + cache_seqlens[b] - Sq: FlashAttention's ``causal=True`` with ``cache_seqlens``;
    ``causal=True`` here stays top-left, j <= i). Calls the decoding kernel takes (at most 64 query rows per
    kv head and the rest of its conditions under num_splits; with num_splits=1 it runs them as one
    chunk) read the lengths on the GPU in one launch, and a split skips the chunks past an
    entry's length; every other call reads them back (one
    synchronisation, so not inside CUDA-graph capture), checks them, and runs one call per batch
    entry; so does the backward. CUDA lengths the decoding kernel reads are not checked
    (FlashAttention's contract): values outside [0, Sk] are clamped there, and the backward
    then raises on them.

    A row that sees no key gets output 0 and lse -inf (torch's SDPA gives NaN there).

    CUDA tensors run the CUDA kernels; CPU tensors run the fp64 reference (slow, exact).

    Differentiable with respect to q, k and v (on CUDA the Hopper backward for float16 and
    bfloat16 at head dims 64/96/128/192/256 on compute capability 9.0, the tensor-core backward for
    them at head dims 32/64/96/128/192/256 on sm80+ (192 and 256 where a block may have the
    shared memory they need: A100, H100), the SIMT backward otherwise, chosen by ``backend`` as for
    the forward: see ``selected_backend(..., backward=True)``; the fp64 reference on the CPU).
    The Hopper and tensor-core backwards add dq with fp32 atomics, so dq may differ in the last
    bits between runs; under
    ``torch.use_deterministic_algorithms(True)`` it uses an atomic-free dq kernel instead
    (bit-identical). lse is returned for inspection and is not differentiable.
    """
    # The backward needs lse: compute it whenever autograd will record this call. getattr lets a
    # non-tensor argument reach the op's named error.
    needs_lse = return_lse or (torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
        or getattr(v, "requires_grad", False)))
    left, right = _window_pair(window)
    if window_follows_causal and not _causal_is_lower_right(causal):
        raise ValueError("samattn: window_follows_causal places the window around the "
                         "bottom-right diagonal: it needs causal='lower_right', got "
                         f"causal={causal!r}")
    if cache_seqlens is not None or window_follows_causal:
        # Each entry's own length sets its bottom-right alignment: the kernels apply it, so the
        # whole call is one operator call whatever the options.
        lower_right = _causal_is_lower_right(causal)
        block_map, blocks = None, (128, 128)
        if block_sparse is not None:
            block_map = block_sparse.to_map(k.shape[2])
            blocks = (block_sparse.block_q, block_sparse.block_k)
        out, lse = ops.attention_forward(q, k, v, scale, bool(causal) and not lower_right,
                                         kv_stride, needs_lse, backend, attn_mask, left, right,
                                         sparse_pattern, sparse_block, sparse_summary, block_map,
                                         *blocks, num_splits, cache_seqlens, lower_right,
                                         window_follows_causal)
        return (out, lse) if return_lse else out
    if causal is not False and causal is not True:
        return _lower_right_or_named(q, k, v, causal, scale, kv_stride, return_lse, backend,
                                     attn_mask, left, right, sparse_pattern, sparse_block,
                                     sparse_summary, block_sparse, num_splits)
    if num_splits != 1:
        block_map = None if block_sparse is None else block_sparse.to_map(k.shape[2])
        blocks = (128, 128) if block_sparse is None else (block_sparse.block_q,
                                                          block_sparse.block_k)
        out, lse = ops.attention_forward(q, k, v, scale, causal, kv_stride, needs_lse, backend,
                                         attn_mask, left, right, sparse_pattern, sparse_block,
                                         sparse_summary, block_map, *blocks, num_splits)
    elif (attn_mask is None and left == -1 and right == -1 and sparse_pattern == "none"
            and block_sparse is None):
        out, lse = ops.attention_forward(q, k, v, scale, causal, kv_stride, needs_lse, backend)
    elif block_sparse is None:
        out, lse = ops.attention_forward(q, k, v, scale, causal, kv_stride, needs_lse, backend,
                                         attn_mask, left, right, sparse_pattern, sparse_block,
                                         sparse_summary)
    else:
        block_map = block_sparse.to_map(k.shape[2])
        out, lse = ops.attention_forward(q, k, v, scale, causal, kv_stride, needs_lse, backend,
                                         attn_mask, left, right, sparse_pattern, sparse_block,
                                         sparse_summary, block_map, block_sparse.block_q,
                                         block_sparse.block_k)
    return (out, lse) if return_lse else out


def _lower_right_or_named(q, k, v, causal, scale, kv_stride, return_lse, backend, attn_mask,
                          left, right, sparse_pattern, sparse_block, sparse_summary,
                          block_sparse, num_splits):
    # causal given by name ("upper_left" / "lower_right"): one call of the kernels' options
    # (_CausalPlan), with the rows that see no key put before its output.
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    plan = _CausalPlan(causal, seqlen_q, seqlen_k, left, right)
    if causal == "lower_right" and sparse_pattern != "none":
        raise ValueError("samattn: causal='lower_right' does not combine with sparse_pattern "
                         f"({sparse_pattern!r} is causal by definition, top-left aligned)")
    if plan.empty_rows and block_sparse is not None:
        raise ValueError("samattn: causal='lower_right' with seqlen_q > seqlen_k does not combine "
                         "with block_sparse (its query blocks would shift)")
    options = dict(scale=scale, kv_stride=kv_stride, return_lse=return_lse, backend=backend,
                   window=plan.window, sparse_pattern=sparse_pattern,
                   sparse_block=sparse_block, sparse_summary=sparse_summary,
                   block_sparse=block_sparse, num_splits=num_splits)
    first = plan.first_row
    if first == 0:
        return attention(q, k, v, causal=plan.causal, attn_mask=attn_mask, **options)
    result = attention(q[..., first:, :], k, v, causal=True,
                       attn_mask=_rows_from(attn_mask, first, seqlen_q), **options)
    out, lse = result if return_lse else (result, None)
    lead = out.shape[:-2]
    out = torch.cat([out.new_zeros(*lead, first, out.shape[-1]), out], dim=-2)
    if not return_lse:
        return out
    return out, torch.cat([lse.new_full((*lead, first), -math.inf), lse], dim=-1)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                    cache_seqlens: Tensor, *, causal: Union[bool, str] = False,
                    scale: Optional[float] = None, num_splits: int = 1,
                    return_lse: bool = False,
                    backend: str = "auto") -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention of new queries against a paged KV cache (vLLM's and FlashAttention's
    ``block_table`` layout), for inference.

    q: (B, Hq, Sq, D), last dimension contiguous. k_cache, v_cache: pools of pages,
    (num_pages, page_size, Hkv, D) and (num_pages, page_size, Hkv, Dv), last dimension contiguous.
    block_table: int32 (B, pages per entry): entry b's key j is row j % page_size of page
    block_table[b, j // page_size]; pages may be shared between entries. cache_seqlens: int32 (B,),
    entry b's keys (0 <= value <= pages per entry x page_size). causal: False; "lower_right"
    (query i sees keys j <= i + cache_seqlens[b] - Sq: new tokens at the end of each entry's
    cache, FlashAttention's causal=True); or "upper_left" (query i sees keys j <= i: the prefill
    of right-padded prompts into empty entries). causal=True raises, as it means the one here and
    the other in FlashAttention.

    On CUDA, calls the decoding kernel takes (float16/bfloat16, head dims 64, 96, 128, 192, 256,
    at most 64 query rows per kv head: see samattn.attention's num_splits; num_splits=0 splits
    the keys automatically) read the pages in place, the table clamped to the pool and not
    checked (FlashAttention's contract); every other call, and CPU tensors, read a dense copy
    gathered from the pages. Not differentiable.
    """
    if not (causal is False or causal in _CAUSAL_NAMES):
        raise ValueError("samattn: paged_attention takes causal=False, 'lower_right' (new tokens "
                         "at the end of each entry's cache) or 'upper_left', got " + repr(causal))
    lower_right = _causal_is_lower_right(causal)
    out, lse = ops.paged_attention_forward(q, k_cache, v_cache, block_table, cache_seqlens, scale,
                                           causal == "upper_left", lower_right, num_splits,
                                           return_lse, backend)
    return (out, lse) if return_lse else out


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
                     causal: Union[bool, str] = False, scale: Optional[float] = None,
                     window: Optional[Tuple[int, int]] = None, return_lse: bool = False,
                     backend: str = "auto",
                     window_follows_causal: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention over a batch of sequences of different lengths, packed (FlashAttention-2's
    varlen convention).

    q: (total_q, Hq, D); k: (total_k, Hkv, D); v: (total_k, Hkv, Dv), last dimension
    contiguous. cu_seqlens_q / cu_seqlens_k: int32, on the inputs' device, B + 1 non-decreasing
    entries starting at 0 and ending at total_q / total_k: sequence b is rows
    [cu_seqlens[b], cu_seqlens[b + 1]). Zero-length sequences are allowed. max_seqlen_q/k bound
    the lengths. causal and window count positions from each sequence's start. causal: True or
    "upper_left" is top-left aligned (query i sees keys j <= i, as in samattn.attention);
    "lower_right" is bottom-right aligned per sequence (query i sees keys j <= i + Sk - Sq with
    that sequence's lengths: FlashAttention-2's varlen causal=True, for chunked prefill against
    each sequence's cache; a sequence with Sq > Sk has its first Sq - Sk rows see no key, output
    0 and lse -inf). Returns out (total_q, Hq, Dv) and, with return_lse, lse (Hq, total_q).
    Differentiable with respect to q, k and v.

    One launch per kernel on the tensor cores (float16/bfloat16): the kernels read cu_seqlens on
    the device, and CUDA cu_seqlens are not read back (no synchronisation; as in FlashAttention-2
    their contents are the caller's contract: the kernels clamp them, so invalid ones cannot
    make them touch memory outside the tensors, but give undefined values). CPU cu_seqlens are
    checked. The CUDA-core kernels (other dtypes) run one launch per sequence after one host read.
    On compute capability 9.0 the forward runs the Hopper kernel (head dims 64, 96, 128, 192,
    256); its last key block of a sequence is read from the packed k and v, past the sequence's
    end, and masked (as FlashAttention-3 does): the masked keys' weights are exactly 0, but an inf
    or NaN in v within the next 128 rows of another sequence still turns 0 * v into NaN there.
    """
    needs_lse = return_lse or (torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
        or getattr(v, "requires_grad", False)))
    left, right = _window_pair(window)
    lower_right = _causal_is_lower_right(causal)
    if window_follows_causal and not lower_right:
        raise ValueError("samattn: window_follows_causal needs causal='lower_right', got "
                         f"causal={causal!r}")
    out, lse = ops.varlen_attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, scale, bool(causal) and not lower_right,
                                            left, right, needs_lse, backend, lower_right,
                                            window_follows_causal)
    return (out, lse) if return_lse else out


def selected_backend(q: Tensor, k: Tensor, v: Tensor, *, causal: Union[bool, str] = False,
                     kv_stride: int = 1, backend: str = "auto",
                     attn_mask: Optional[Tensor] = None,
                     window: Optional[Tuple[int, int]] = None, sparse_pattern: str = "none",
                     sparse_block: int = 0, sparse_summary: int = 0, block_sparse=None,
                     backward: bool = False, num_splits: int = 1, detail: bool = False,
                     cache_seqlens: Optional[Tensor] = None,
                     window_follows_causal: bool = False) -> str:
    """Which kernel family samattn.attention would run for these CUDA tensors and options on this
    GPU: "simt", "tensor_core" or "hopper". Forcing "simt" (argument or SAMATTN_FORCE_SIMT=1) is
    honoured. A call that num_splits splits runs its chunks on "tensor_core".

    detail=True (forward only): for a split call also which kernel runs its chunks and how many,
    e.g. "tensor_core: decoding kernel, 32 key chunks" (for logs and benchmarks; the wording may
    change).

    backward=True: the family of its backward instead (unmasked calls; the gradients, out and
    dout contiguous, as autograd passes them), which can differ from the forward's: e.g. on
    compute capability 9.0 head dim 256 runs the Hopper forward and the SIMT backward. A backend
    the backward cannot honour raises ValueError naming the reason.

    cache_seqlens (forward only): as in samattn.attention; a call that runs one call per batch
    entry names the family of its entries (with detail, "..., one call per batch entry
    (cache_seqlens)")."""
    if window_follows_causal and not _causal_is_lower_right(causal):
        raise ValueError("samattn: window_follows_causal needs causal='lower_right', got "
                         f"causal={causal!r}")
    if cache_seqlens is not None or window_follows_causal:
        if backward:
            raise ValueError("selected_backend(backward=True) takes no cache_seqlens or "
                             "window_follows_causal")
        lower_right = _causal_is_lower_right(causal)
        left, right = _window_pair(window)
        extra = (None, 128, 128) if block_sparse is None else (
            block_sparse.to_map(k.shape[2]), block_sparse.block_q, block_sparse.block_k)
        return ops.selected_backend(q, k, v, bool(causal) and not lower_right, kv_stride,
                                    backend, attn_mask, left, right, sparse_pattern,
                                    sparse_block, sparse_summary, *extra, num_splits, detail,
                                    cache_seqlens, lower_right, window_follows_causal)
    if causal is not False and causal is not True:
        # As samattn.attention runs a named causal option: on the trailing rows, with a window.
        plan = _CausalPlan(causal, q.shape[-2], k.shape[-2], *_window_pair(window))
        q, causal, window = q[..., plan.first_row:, :], plan.causal, plan.window
    if backward:
        if attn_mask is not None or window is not None or sparse_pattern != "none" or \
                block_sparse is not None:
            raise ValueError("selected_backend(backward=True) takes no mask options (attn_mask, "
                             "window, sparse_pattern, block_sparse, or causal='lower_right' "
                             "with seqlen_k > seqlen_q, a window)")
        return ops.selected_backward_backend(q, k, v, causal, kv_stride, backend)
    left, right = _window_pair(window)
    extra = (None, 128, 128) if block_sparse is None else (
        block_sparse.to_map(k.shape[2]), block_sparse.block_q, block_sparse.block_k)
    return ops.selected_backend(q, k, v, causal, kv_stride, backend, attn_mask, left, right,
                                sparse_pattern, sparse_block, sparse_summary, *extra, num_splits,
                                detail)


def _as_4d(t: Tensor, name: str) -> Tensor:
    if t.dim() == 4:
        return t
    if t.dim() == 3:
        return t.unsqueeze(0)
    if t.dim() > 4:
        return t.reshape(-1, *t.shape[-3:])
    raise ValueError(f"samattn: {name} must have at least 3 dimensions (..., L, E), "
                     f"got shape {tuple(t.shape)}")


def _causal_bias_variant(attn_mask, query: Tensor, key: Tensor) -> Optional[str]:
    # torch.nn.attention.bias.CausalBias (causal_upper_left / causal_lower_right): the causal
    # option it stands for, or None for any other mask.
    if attn_mask is None or type(attn_mask).__name__ != "CausalBias":
        return None
    from torch.nn.attention.bias import CausalBias, CausalVariant
    if not isinstance(attn_mask, CausalBias):
        return None
    expected = (query.shape[-2], key.shape[-2])
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != expected:
        raise ValueError(f"samattn: CausalBias attn_mask is for (seq_len_q, seq_len_kv) = "
                         f"({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}), the inputs have "
                         f"{expected}")
    return "lower_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "upper_left"


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    Same signature and semantics for (..., H, L, E) inputs, including attn_mask (boolean, True
    = attend, or additive float, broadcastable to (..., L, S), or torch's CausalBias from
    ``torch.nn.attention.bias.causal_upper_left`` / ``causal_lower_right``, which runs the causal
    kernels without a mask tensor). Not supported (raises NotImplementedError): dropout_p > 0.

    One difference: a query row whose keys are all masked out gives output 0 here, where torch
    gives NaN. attn_mask receives no gradient.
    """
    causal_bias = _causal_bias_variant(attn_mask, query, key)
    if causal_bias is not None:
        if is_causal:
            raise ValueError("samattn: a CausalBias attn_mask cannot be combined with "
                             "is_causal=True (as in torch)")
        attn_mask, is_causal = None, causal_bias
    if attn_mask is not None and is_causal:
        # torch raises here too: the two are mutually exclusive in SDPA.
        raise ValueError("samattn: attn_mask and is_causal=True cannot be combined in "
                         "scaled_dot_product_attention (as in torch); use samattn.attention")
    if dropout_p != 0.0:
        raise NotImplementedError("samattn.scaled_dot_product_attention: dropout_p must be 0.0, "
                                  f"got {dropout_p}")
    rank = query.dim()
    if rank < 3 or key.dim() != rank or value.dim() != rank:
        raise ValueError("samattn: query, key and value must have the same rank (>= 3), got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(f"samattn: query has {query.shape[-3]} heads but key has "
                         f"{key.shape[-3]}; pass enable_gqa=True for grouped-query attention")
    mask = None
    if attn_mask is not None:
        # Broadcast to the inputs' leading dimensions, then fold them like the inputs (views,
        # stride 0 where broadcast).
        target = (*query.shape[:-2], query.shape[-2], key.shape[-2])
        try:
            mask = attn_mask.expand(target)
        except RuntimeError:
            raise ValueError(f"samattn: attn_mask of shape {tuple(attn_mask.shape)} is not "
                             f"broadcastable to {target}") from None
        mask = _as_4d(mask, "attn_mask")
    out = attention(_as_4d(query, "query"), _as_4d(key, "key"), _as_4d(value, "value"),
                    causal=is_causal, scale=scale, attn_mask=mask)
    # 4-D inputs (the common case) already have the output's shape: skip the reshape's host time.
    return out if rank == 4 else out.reshape(*query.shape[:-1], value.shape[-1])


def strided_attention(q: Tensor, k: Tensor, v: Tensor, stride: int) -> Tensor:
    """Seed 000's strided attention: query i attends to keys 0, stride, 2*stride, ...

    Computes exactly softmax(q k^T / sqrt(D)) v over the kept keys. The course's
    naive_strided_attention adds 1e-6 to the softmax denominator; samattn does not, so the two
    differ by about 1e-6 relative.
    """
    return attention(q, k, v, kv_stride=stride)


def fused_attention(Q: Tensor, K: Tensor, V: Tensor) -> Tensor:
    """Seed 001's entry point: softmax(Q K^T / sqrt(D)) V on (B, H, S, D) tensors."""
    return attention(Q, K, V)


def fused_attention_with_mask(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor) -> Tensor:
    """Seed 001's masked entry point: softmax(Q K^T / sqrt(D) + mask) V on (B, H, S, D) tensors,
    with `mask` boolean (True = attend) or additive float, broadcastable to (B, H, Sq, Sk).
    A fully masked row gives 0 (not NaN)."""
    return attention(Q, K, V, attn_mask=mask)


def self_attention(x: Tensor, output: Tensor, d: int, fused: bool = True) -> Tensor:
    """Seed 002's entry point: attention of the (N, d) matrix x with itself (Q = K = V = x,
    scale 1/sqrt(d)), written into `output` (N, d). Returns `output`.

    fused=False runs seed 002's unfused design instead (samattn.attention_unfused: GEMM, row
    softmax, GEMM, with the N x N scores in memory).

    Not differentiable: it writes into `output` through attention_forward_into, which has no
    backward (use samattn.attention for gradients); x requiring grad raises RuntimeError."""
    if x.dim() != 2:
        raise ValueError(f"samattn.self_attention: x must be 2-D (N, d), got shape "
                         f"{tuple(x.shape)}")
    if x.shape[1] != d:
        raise ValueError(f"samattn.self_attention: d ({d}) must equal x.shape[1] ({x.shape[1]})")
    if output.shape != x.shape:
        raise ValueError(f"samattn.self_attention: output must have shape {tuple(x.shape)}, got "
                         f"{tuple(output.shape)}")
    if output.dtype != x.dtype or output.device != x.device:
        raise ValueError(f"samattn.self_attention: output must be {x.dtype} on {x.device}, got "
                         f"{output.dtype} on {output.device}")
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError("samattn.self_attention writes into `output` and is not "
                           "differentiable; use samattn.attention(q, k, v) for gradients")
    if not fused:
        from samattn.linalg import attention_unfused
        output.copy_(attention_unfused(x, x, x, scale=1.0 / math.sqrt(d)))
        return output
    view = x.view(1, 1, *x.shape)
    ops.attention_forward_into(view, view, view, output.view(1, 1, *output.shape),
                               1.0 / math.sqrt(d), False, 1, "auto")
    return output
