"""A stand-in for the model runner in length-only simulations.

Everything else (block manager, scheduler, sampler, beam search, accounting) is the real
engine's code; only the forward pass is replaced by seeded random logits, so lengths, forks,
CoW, preemption and swapping happen exactly as they would, at simulation speed.
"""
from __future__ import annotations

import torch


class SyntheticRunner:
    bytes_per_block = 0
    device, dtype, backend, ops = "cpu", torch.float32, "none", None

    def __init__(self, vocab_size: int, seed: int):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def move_kv(self, batch) -> None:
        """No KV bytes to move without a model."""

    def execute(self, batch) -> torch.Tensor:
        return torch.rand(len(batch.scheduled), self.vocab_size, generator=self.generator)
