"""FlexAttention, compiled once for the whole benchmark process.

torch.compile re-traces flex_attention for every new shape or block mask, and dynamo gives up on
a function after `recompile_limit` (8 by default) traces: later calls then run FlexAttention's
eager fallback, which materialises the score matrix and is many times slower (forward and
backward). A benchmark sweep easily passes 8 shapes, so the limit is raised, and a hit raises an
error (reported as "n/a") instead of silently timing the fallback.

The benchmarks time a backward by calling it repeatedly on one forward graph (retain_graph=True);
AOTAutograd's donated buffers (the backward reusing the saved activations' memory) forbid that,
so they are turned off: a memory saving, not a speed one.
"""

from __future__ import annotations

import torch

_COMPILED = {}
_RECOMPILE_LIMIT = 1024


def compiled_flex_attention():
    if "flex" not in _COMPILED:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, _RECOMPILE_LIMIT)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit,
                                                 _RECOMPILE_LIMIT)
        config.fail_on_recompile_limit_hit = True
        import torch._functorch.config
        torch._functorch.config.donated_buffer = False
        compiled = torch.compile(flex_attention, dynamic=False)

        def call(*args, **kwargs):
            try:
                return compiled(*args, **kwargs)
            except torch._dynamo.exc.FailOnRecompileLimitHit as error:
                raise RuntimeError(f"FlexAttention recompile limit hit: {error}") from error

        _COMPILED["flex"] = call
    return _COMPILED["flex"]
