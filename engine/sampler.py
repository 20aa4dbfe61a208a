"""Token choice for one row of logits: greedy, temperature, top-k, top-p, seeded per request."""
from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest top-p nucleus."""
    logits = logits.clone()
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits[logits < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        logits[order[drop]] = float("-inf")
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           num_samples: int = 1) -> list[int]:
    """Choose ``num_samples`` tokens from one row of logits ([vocab], float32)."""
    if params.is_greedy:
        return [int(torch.argmax(logits))] * num_samples
    scaled = filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, num_samples, replacement=True, generator=generator).tolist()
