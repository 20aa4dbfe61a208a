"""Small helpers shared by the engine tests."""
from __future__ import annotations

import torch

from engine import Engine


def hf_greedy(model, prompt: list[int], max_new_tokens: int, **kw) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         **kw)
    return out[0, len(prompt):].tolist()


def run_all(eng: Engine) -> list:
    """Step until idle; returns every StepResult."""
    results = []
    while eng.has_unfinished_requests():
        results.append(eng.step())
        eng.check_invariants()
    return results


def kinds(result) -> list[str]:
    return [e.kind for e in result.events]
