"""Decoding: one query per (batch, head) against a KV cache (and 5 draft tokens, as speculative
decoding verifies them, bottom-right causal), bf16, head dim 128, where the keys and values in
memory set the time. samattn unsplit (num_splits=1, one thread block per
(batch, head): a few SMs stream the whole cache) against its split-key forward (num_splits=0,
automatic; and a fixed count) and torch SDPA's flash, cuDNN and memory-efficient backends, in
alternating rounds in one process, the caches in (B, S, H, D) storage as a model keeps them, and
enough copies of the inputs cycled that no call finds them in L2.

Floor: a call must read the cache once, 2 * B * S * Hkv * D * 2 bytes; the JSON gives each
method's effective bandwidth (those bytes over its time), to hold against the GPU's HBM
bandwidth. Outputs are checked against SDPA's math backend in float32 on the same inputs before timing;
the exit status is 1 when a split output is further from it than the unsplit one by more than
one bf16 rounding.

    python3 benchmarks/bench_decode.py --out $OUT/decode.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import samattn
from samattn.bench.report import environment
from samattn.bench.timing import measure_interleaved, rotation_count

HEAD_DIM = 128
# (batch, query heads, kv heads, new queries, cached keys, padded): padded rows give each batch
# entry its own cache length through a (B, 1, 1, S) boolean mask, as a padded batch decodes, and
# (samattn only) through cache_seqlens.
SHAPES = [(1, 32, 8, 1, 4096, False), (1, 32, 8, 1, 16384, False), (1, 32, 8, 1, 65536, False),
          (4, 32, 8, 1, 16384, False), (16, 32, 8, 1, 8192, False), (1, 32, 32, 1, 16384, False),
          (64, 32, 8, 1, 2048, False), (1, 32, 8, 5, 16384, False), (4, 32, 8, 5, 16384, False),
          (4, 32, 8, 1, 16384, True)]
PAGE_SIZES = (16, 256)  # the padded row's paged methods
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def input_sets(batch, heads_q, heads_kv, queries, keys, count, generator):
    """`count` independent (q, k, v) sets: q (B, Hq, T, D), k and v (B, Hkv, S, D) views of
    (B, T or S, H, D) storage."""
    sets = []
    for _ in range(count):
        q = torch.randn(batch, queries, heads_q, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                        generator=generator).transpose(1, 2)
        k, v = (torch.randn(batch, keys, heads_kv, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                            generator=generator).transpose(1, 2) for _ in range(2))
        sets.append((q, k, v))
    return sets


def paged_call(q, k, v, lengths, page_size):
    """samattn.paged_attention on k and v's (B, S, H, D) storage as pools of pages."""
    batch, _, keys, _ = k.shape
    pages = keys // page_size
    pools = [t.transpose(1, 2).reshape(batch * pages, page_size, t.shape[1], t.shape[3])
             for t in (k, v)]
    table = torch.arange(batch * pages, device=k.device, dtype=torch.int32).view(batch, pages)
    return lambda: samattn.paged_attention(q, *pools, table, lengths, causal="lower_right",
                                           num_splits=0)


def methods_for(sets, splits: int, gqa: bool, bias, lengths=None) -> dict:
    """bias: torch's causal_lower_right for the drafts, a boolean padding mask, or None for one
    query (which sees all). lengths (padded rows): the same cache lengths as cache_seqlens, which
    lets samattn's split skip the padding instead of reading and masking it."""
    padding = bias if isinstance(bias, torch.Tensor) and bias.dtype == torch.bool else None

    def samattn_call(q, k, v, num_splits):
        return lambda: samattn.attention(q, k, v, causal="lower_right", attn_mask=padding,
                                         num_splits=num_splits)

    def sdpa_call(q, k, v, backend):
        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                                        enable_gqa=gqa)
        return call

    methods = {"samattn": [samattn_call(*s, 1) for s in sets],
               "samattn_split_auto": [samattn_call(*s, 0) for s in sets],
               f"samattn_split_{splits}": [samattn_call(*s, splits) for s in sets]}
    if lengths is not None:
        methods["samattn_cache_seqlens_auto"] = [
            (lambda q, k, v: lambda: samattn.attention(q, k, v, causal="lower_right",
                                                       cache_seqlens=lengths, num_splits=0))(*s)
            for s in sets]
        # The same caches read as pools of pages (their (B, S, H, D) storage cut into pages, the
        # table in order): what the paged addressing costs over the dense one.
        for page_size in PAGE_SIZES:
            methods[f"samattn_paged{page_size}_auto"] = [paged_call(*s, lengths, page_size)
                                                         for s in sets]
    for name, backend in SDPA_BACKENDS.items():
        methods[name] = [sdpa_call(*s, backend) for s in sets]
    return methods


def kernel_times_us(call, reps: int = 20) -> dict:
    """Mean GPU time per call of each kernel `call` launches (torch.profiler, after the timing,
    so the profiler never shares a timed round): which of the split's kernels (chunks, merge)
    holds the time. One input set, called again and again: a cache that fits L2 reads faster
    here than in the timed rounds. Never fails the benchmark: an error is recorded instead."""
    try:
        from torch.profiler import ProfilerActivity, profile
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()
        times = {}
        for event in prof.key_averages():
            total = getattr(event, "self_device_time_total", None)
            if total is None:
                total = getattr(event, "self_cuda_time_total", 0.0)
            if total > 0:
                times[event.key[:160]] = {"us_per_call": total / reps,
                                          "launches_per_call": event.count / reps}
        return times
    except Exception as error:  # noqa: BLE001 - a profiler failure must not lose the timings
        return {"error": str(error).splitlines()[0][:200]}


def max_error(call, reference) -> float:
    return (call().float() - reference).abs().max().item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="decode.json")
    parser.add_argument("--budget-ms", type=float, default=200.0)
    parser.add_argument("--splits", type=int, default=8, help="the fixed chunk count timed")
    args = parser.parse_args(argv)
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, failed = [], False
    for batch, heads_q, heads_kv, queries, keys, padded in SHAPES:
        cache_bytes = 2 * batch * keys * heads_kv * HEAD_DIM * 2
        count = rotation_count(cache_bytes, torch.cuda.mem_get_info()[0])
        sets = input_sets(batch, heads_q, heads_kv, queries, keys, count, generator)
        gqa = heads_q != heads_kv
        bias = causal_lower_right(queries, keys) if queries > 1 else None
        lengths = None
        if padded:  # cache lengths from a quarter to all of the keys
            lengths = torch.linspace(keys // 4, keys, batch, device="cuda").to(torch.int32)
            bias = (torch.arange(keys, device="cuda")[None, :] < lengths[:, None])[:, None, None]
        methods = methods_for(sets, args.splits, gqa, bias, lengths)
        q, k, v = sets[0]
        with sdpa_kernel(SDPBackend.MATH):
            reference = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=bias, enable_gqa=gqa)
        errors, runnable = {}, {}
        for name, calls in methods.items():
            try:
                errors[name] = max_error(calls[0], reference)
                runnable[name] = calls
            except (RuntimeError, ValueError) as error:  # e.g. an SDPA backend declining
                errors[name] = f"not run: {str(error).splitlines()[0][:200]}"
        torch.cuda.synchronize()
        # A split output further from the reference than the unsplit one by more than one bf16
        # rounding of the output's largest element is wrong, not rounded differently.
        unsplit = errors["samattn"]
        failed = failed or not isinstance(unsplit, float)
        if isinstance(unsplit, float):
            bound = unsplit + reference.abs().max().item() * 2.0 ** -8
            checked = ["samattn_split_auto", f"samattn_split_{args.splits}"]
            if padded:
                checked += ["samattn_cache_seqlens_auto"] + [f"samattn_paged{p}_auto"
                                                             for p in PAGE_SIZES]
            for name in checked:
                if not isinstance(errors[name], float) or errors[name] > bound:
                    failed = True
        timings = measure_interleaved(runnable, rounds=2, budget_ms=args.budget_ms)
        sdpa = [t.median_ms for n, t in timings.items() if n.startswith("sdpa")]
        best_sdpa = min(sdpa) if sdpa else None
        row = {"batch": batch, "heads_q": heads_q, "heads_kv": heads_kv, "seqlen_q": queries,
               "seqlen_k": keys, "causal": "lower_right", "padded": padded, "head_dim": HEAD_DIM,
               "cache_bytes": cache_bytes, "input_sets": count,
               # The bytes of the keys the lengths hold: the floor of cache_seqlens' call.
               "useful_cache_bytes": (2 * int(lengths.sum().item()) * heads_kv * HEAD_DIM * 2
                                      if padded else cache_bytes),
               "selected_backend": {
                   "unsplit": samattn.selected_backend(q, k, v, causal="lower_right",
                                                       attn_mask=bias if padded else None),
                   "split_auto": samattn.selected_backend(q, k, v, causal="lower_right",
                                                          attn_mask=bias if padded else None,
                                                          num_splits=0, detail=True),
                   f"split_{args.splits}": samattn.selected_backend(
                       q, k, v, causal="lower_right", attn_mask=bias if padded else None,
                       num_splits=args.splits, detail=True)},
               "max_abs_error_vs_fp32": errors, "methods": {},
               "kernel_times_split_auto": kernel_times_us(methods["samattn_split_auto"][0])}
        if padded:
            row["selected_backend"]["cache_seqlens_auto"] = samattn.selected_backend(
                q, k, v, causal="lower_right", num_splits=0, detail=True, cache_seqlens=lengths)
        for name, t in timings.items():
            row["methods"][name] = {
                "median_ms": t.median_ms, "min_ms": t.min_ms, "max_ms": t.max_ms,
                "reps": t.reps, "cache_gb_per_s": cache_bytes / (t.median_ms * 1e-3) / 1e9,
                "best_sdpa_over_this": best_sdpa / t.median_ms if best_sdpa else None}
        rows.append(row)
        line = " ".join(f"{n}={t.median_ms * 1e3:.1f}us" for n, t in timings.items())
        print(f"B={batch} Hq={heads_q} Hkv={heads_kv} T={queries} S={keys}"
              f"{' padded' if padded else ''}: {line}")
    result = {**environment(), "dtype": "bf16", "layout": "(B, S, H, D) caches",
              "split_outputs_within_bound": not failed, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"split outputs within bound: {not failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
