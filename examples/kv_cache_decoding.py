"""Generation with a KV cache on samattn: a prompt's prefill (causal), then steps of new tokens
against the cached keys and values (causal="lower_right": new token i sees the cache and the
new tokens up to itself), with split-key attention for the one-token steps (num_splits=0; it
only changes anything on a GPU). Then a ragged batch (prompts of different lengths) in
preallocated caches, dense (samattn.KVCache: each entry's keys are the first cache_seqlens[b]
rows) and paged (samattn.PagedKVCache: pages of a shared pool listed in a block table): every
decoding step writes each entry's new token at its own position. Every step's logits are checked
against running each sequence again without a cache.

    python examples/kv_cache_decoding.py                 # CPU, float64 (the fp64 reference)
    python examples/kv_cache_decoding.py --device cuda   # GPU, bfloat16
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import samattn


class Layer(nn.Module):
    """Pre-norm attention (grouped-query) and MLP with residuals, (B, S, E) -> (B, S, E)."""

    def __init__(self, embed: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, embed // heads
        self.norm1, self.norm2 = nn.LayerNorm(embed), nn.LayerNorm(embed)
        self.q = nn.Linear(embed, embed)
        self.kv = nn.Linear(embed, 2 * kv_heads * self.dim)
        self.out = nn.Linear(embed, embed)
        self.mlp = nn.Sequential(nn.Linear(embed, 4 * embed), nn.GELU(), nn.Linear(4 * embed, embed))

    def forward(self, x, cache=None, num_splits=1):
        """x: the new tokens (B, T, E). cache: (k, v) of earlier tokens, (B, Hkv, S, D) each, or
        None. Returns the output and the cache with the new tokens appended."""
        batch, new, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(batch, new, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, new, 2, self.kv_heads, self.dim).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        # New token i is at position S - T + i: it sees every cached key and the new ones up to
        # itself, bottom-right aligned. With T == S (the prefill) this is plain causal.
        a = samattn.attention(q, k, v, causal="lower_right", num_splits=num_splits)
        x = x + self.out(a.transpose(1, 2).reshape(batch, new, -1))
        return x + self.mlp(self.norm2(x)), (k, v)

    def forward_cached(self, x, cache, counts, causal, num_splits):
        """x: new tokens (B, T, E) appended to `cache` (a samattn.KVCache or PagedKVCache), entry
        b bringing counts[b] of them (the rest, padding of a ragged prefill, lies past its length,
        so no query sees it)."""
        batch, new, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(batch, new, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, new, 2, self.kv_heads, self.dim).permute(2, 0, 3, 1, 4)
        cache.append(k, v, counts)
        a = cache.attend(q, causal=causal, num_splits=num_splits)
        x = x + self.out(a.transpose(1, 2).reshape(batch, new, -1))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab=97, embed=64, heads=8, kv_heads=2, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.layers = nn.ModuleList(Layer(embed, heads, kv_heads) for _ in range(layers))
        self.head = nn.Linear(embed, vocab)

    def forward(self, tokens, caches=None, num_splits=1):
        x = self.embed(tokens)
        new_caches = []
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, None if caches is None else caches[i], num_splits)
            new_caches.append(cache)
        return self.head(x), new_caches


def forward_cached(model, tokens, caches, counts, causal, num_splits):
    x = model.embed(tokens)
    for layer, cache in zip(model.layers, caches):
        x = layer.forward_cached(x, cache, counts, causal, num_splits)
    return model.head(x)


def make_caches(model, batch, tokens, paged):
    """One cache per layer for `tokens` tokens per entry: dense, or paged (pages of 4 rows from a
    pool shared by the entries)."""
    first, dtype = model.layers[0], model.head.weight.dtype
    device = model.head.weight.device
    if paged:
        page_size = 4
        pages = batch * -(-tokens // page_size)
        return [samattn.PagedKVCache(batch, pages, page_size, first.kv_heads, first.dim,
                                     dtype=dtype, device=device) for _ in model.layers]
    return [samattn.KVCache(batch, first.kv_heads, tokens, first.dim, dtype=dtype, device=device)
            for _ in model.layers]


def generate_ragged(model, prompts, steps, paged=False):
    """Greedy generation for prompts of different lengths in one batch: right-padded prompts
    prefilled at once (each entry keeps only its prompt's keys; its real queries, the first
    rows, see their prompt up to themselves), then one token per entry per step (num_splits=0),
    all bottom-right causal. Returns the largest difference between an entry's logits and its
    sequence recomputed alone."""
    device = prompts[0].device
    batch, longest = len(prompts), max(len(p) for p in prompts)
    caches = make_caches(model, batch, longest + steps, paged)
    padded = torch.zeros(batch, longest, dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        padded[b, :len(p)] = p
    counts = [len(p) for p in prompts]
    logits = forward_cached(model, padded, caches, counts, "lower_right", 1)
    last = logits[torch.arange(batch, device=device), torch.tensor(counts, device=device) - 1]
    sequences = [p.clone() for p in prompts]

    def difference():
        worst = 0.0
        for b in range(batch):
            alone = model(sequences[b].unsqueeze(0))[0][0, -1]
            worst = max(worst, (last[b].float() - alone.float()).abs().max().item())
        return worst

    worst = difference()
    for _ in range(steps):
        new = last.argmax(-1)
        sequences = [torch.cat([s, new[b:b + 1]]) for b, s in enumerate(sequences)]
        last = forward_cached(model, new.unsqueeze(1), caches, None, "lower_right", 0)[:, 0]
        worst = max(worst, difference())
    return worst


def generate(model, prompt, steps, chunk=3):
    """Greedy generation: the prompt's prefill, `chunk` tokens fed at once once (as speculative
    decoding verifies drafts), then one token per step. Returns the tokens and the largest
    difference between a step's logits and the whole sequence's recomputed without a cache."""
    tokens = prompt
    logits, caches = model(tokens)
    worst = 0.0
    for step in range(steps):
        if step == 1:
            # Feed `chunk` tokens at once: the last logits' argmax, then chunk - 1 more.
            new = torch.cat([logits[:, -1:].argmax(-1),
                             torch.randint(0, logits.shape[-1], (tokens.shape[0], chunk - 1),
                                           device=tokens.device)], dim=1)
        else:
            new = logits[:, -1:].argmax(-1)
        tokens = torch.cat([tokens, new], dim=1)
        logits, caches = model(new, caches, num_splits=0 if new.shape[1] == 1 else 1)
        full, _ = model(tokens)
        worst = max(worst, (logits.float() - full[:, -new.shape[1]:].float()).abs().max().item())
    return tokens, worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    dtype = torch.float64 if args.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = TinyDecoder().to(device=args.device, dtype=dtype).eval()
    prompt = torch.randint(0, 97, (2, 11), device=args.device)
    prompts = [torch.randint(0, 97, (n,), device=args.device) for n in (11, 4, 7)]
    with torch.no_grad():
        tokens, worst = generate(model, prompt, args.steps)
        ragged_worst = max(generate_ragged(model, prompts, args.steps),
                           generate_ragged(model, prompts, args.steps, paged=True))
    # float64 agrees to rounding. In bfloat16 the cached and the recomputed path round
    # differently (other matrix shapes, split keys) through both layers; the limit is an estimate
    # not yet checked on a GPU: 16 units of bfloat16's last place at logits of magnitude ~4.
    limit = 1e-9 if dtype == torch.float64 else 16 * 4 * 2.0 ** -8
    print(f"generated {tokens.shape[1] - prompt.shape[1]} tokens per sequence on {args.device}; "
          f"largest logit difference cached vs recomputed: {worst:.3g} (limit {limit})")
    print(f"ragged batch of prompts of {[len(p) for p in prompts]} tokens in preallocated "
          f"caches (samattn.KVCache, samattn.PagedKVCache): largest logit difference "
          f"{ragged_worst:.3g} (limit {limit})")
    return 0 if max(worst, ragged_worst) <= limit else 1


if __name__ == "__main__":
    sys.exit(main())
