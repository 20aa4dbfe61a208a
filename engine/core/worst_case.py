"""How much KV memory a request can ever need (docs/architecture.md#a-request-fits).

A request "fits" when its worst case fits the pool: the prompt's full blocks shared by all its
sequences, plus each live sequence's own blocks for the rest of its longest possible length.
That length is ``prompt + max_tokens - 1`` tokens of K/V, not ``prompt + max_tokens``: the
last sampled token is returned but never fed back, so its K/V is never written.
"""
from __future__ import annotations

from engine.core.block_math import cdiv


def kv_tokens_at_most(prompt_len: int, max_tokens: int) -> int:
    """Most tokens one sequence of this request ever holds in the KV cache."""
    return prompt_len + max_tokens - 1


def blocks_needed_worst_case(prompt_len: int, max_tokens: int, width: int,
                             block_size: int) -> int:
    """Blocks one request of ``width`` live sequences can hold at its longest: the prompt's
    full blocks shared, every live sequence owning the rest of its blocks."""
    shared = prompt_len // block_size
    per_seq = cdiv(kv_tokens_at_most(prompt_len, max_tokens), block_size) - shared
    return shared + width * per_seq


def pool_too_small(need: int, num_prompt_tokens: int, max_tokens: int,
                   block_size: int, width: str, pool: str) -> str:
    """The refusal of a request that could never run in this pool."""
    return (f"this request can need {need} KV blocks ({num_prompt_tokens} prompt + "
            f"{max_tokens} new tokens{width}, block_size {block_size}) but the "
            f"pool has {pool}: it could never run. Raise num_gpu_blocks or lower max_tokens / "
            f"n / beam_width.")
