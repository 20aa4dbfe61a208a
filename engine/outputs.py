"""What ``Engine.generate`` returns (shaped like vLLM's RequestOutput / CompletionOutput)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str | None
    seq_id: int


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]      # beam search: best first
    finished: bool
