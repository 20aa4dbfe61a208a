"""vLLM v1's parallel sampling: a request with n > 1 runs as n child requests of n = 1 that
share the prompt through the prefix cache (vllm/v1/engine/parallel_sampling.py), not by fork.
"""
from __future__ import annotations

# children of a request without a seed: child i's default seed is the request's + i * this
# (mod 2**63), far from the next requests' defaults (+1 each) also in the low 32 bits, all that
# torch's CPU generator keeps of a seed (a stride of 2**32 gave two children the same samples)
CHILD_SEED_STRIDE = 0x9E3779B97F4A7C15 % 2 ** 63      # 2**64 / golden ratio: spreads the bits


def child_request_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's children, ``"{i}_{id}"`` as vLLM names them ([] for n == 1)."""
    return [f"{i}_{request_id}" for i in range(n)] if n > 1 else []


def child_seed(seed: int, index: int, seeded: bool) -> int:
    """Child ``index``'s seed: a given seed + index, as vLLM's; without one, vLLM's children
    draw independently, so theirs must not meet the next request's default seed (base + 1)."""
    return (seed + index * (1 if seeded else CHILD_SEED_STRIDE)) % 2 ** 63
