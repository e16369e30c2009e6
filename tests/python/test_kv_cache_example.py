"""examples/kv_cache_decoding.py: generation with a KV cache (prefill, a chunk of new tokens,
single tokens with split keys) gives the logits of recomputing the whole sequence."""

from __future__ import annotations

import os
import sys

from helpers import requires_cuda

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

import kv_cache_decoding  # noqa: E402


def test_cached_generation_equals_recomputation_cpu():
    assert kv_cache_decoding.main(["--device", "cpu"]) == 0


@requires_cuda
def test_cached_generation_equals_recomputation_gpu():
    assert kv_cache_decoding.main(["--device", "cuda"]) == 0
