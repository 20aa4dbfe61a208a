"""Our copy of vLLM's CPU sampling noise against vLLM's own compiled kernel
(``torch.ops._C.fused_gumbel_argmax``, vLLM 0.32): the same token for the same logits and
seed, masked logits included."""
from __future__ import annotations

import torch

from engine.processing.vllm_random import gumbel_argmax


def test_gumbel_argmax_equals_vllms_cpu_kernel(vllm_ready):
    import vllm._C  # noqa: F401  (registers torch.ops._C)
    gen = torch.Generator().manual_seed(0)
    rows = 0
    for trial in range(120):
        vocab = (7, 50, 4096)[trial % 3]
        logits = torch.randn(4, vocab, generator=gen) * (0.3 + trial % 5)
        if trial % 4 == 0:
            logits[:, : vocab // 3] = float("-inf")          # top-k / min_tokens masks
        seeds = torch.randint(0, 2 ** 31, (4,), generator=gen, dtype=torch.long)
        theirs = torch.ops._C.fused_gumbel_argmax(logits, seeds).tolist()
        ours = [gumbel_argmax(logits[r], int(seeds[r])) for r in range(4)]
        assert ours == theirs, (trial, ours, theirs)
        rows += 4
    assert rows == 480
