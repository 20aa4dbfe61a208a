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
    # vLLM's stop_reason: the stop string or stop token id that ended the sequence; None when
    # it ended at the length cap or at the model's own EOS token
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]      # beam search: best first
    finished: bool
    # vLLM's: prompt tokens served by the prefix cache when the request was first scheduled
    num_cached_tokens: int | None = None
