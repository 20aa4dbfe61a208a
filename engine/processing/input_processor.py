"""Requests in: tokenization and validation, before anything in the engine changes.

The checks every engine shares are here; what one engine cannot run (v0's prompt limit, v1's
refusal of beam search, each engine's pool rule: docs/architecture.md#a-request-fits) is asked
of its ``EngineSemantics.check_request``.
"""
from __future__ import annotations

import dataclasses

from engine.config import EngineConfig
from engine.models.spec import ModelSpec
from engine.sampling_params import SamplingParams
from engine.sched.interface import EngineSemantics
from engine.sched.registry import semantics_of


def resolve_max_model_len(requested: int | None, model_context: int) -> int:
    """EngineConfig.max_model_len, checked against what the model supports (vLLM refuses a
    max_model_len above the model's context too)."""
    if requested is None:
        return model_context
    if requested > model_context:
        raise ValueError(f"max_model_len {requested} is above the model's context of "
                         f"{model_context} tokens")
    return requested


def unpack_prompt(prompt, cache_salt: str | None = None) -> tuple:
    """(text or token ids, cache salt) of a prompt; vLLM's prompt dicts (TextPrompt
    ``{"prompt": text}``, TokensPrompt ``{"prompt_token_ids": ids}``, either with an optional
    ``"cache_salt"``) are unpacked. Checks only the dict and the salt; no state is touched."""
    if isinstance(prompt, dict):
        keys = set(prompt) - {"cache_salt"}
        if keys == {"prompt_token_ids"}:
            inner = prompt["prompt_token_ids"]
            if not isinstance(inner, (list, tuple)):
                raise ValueError(f"'prompt_token_ids' must be a list of token ids, got "
                                 f"{type(inner).__name__}")
        elif keys == {"prompt"}:
            inner = prompt["prompt"]
            if not isinstance(inner, str):
                raise ValueError(f"'prompt' must be text, got {type(inner).__name__}")
        else:
            raise ValueError(f"a prompt dict holds 'prompt' (text) or 'prompt_token_ids', got "
                             f"keys {sorted(prompt)}")
        if "cache_salt" in prompt:
            if cache_salt is not None and cache_salt != prompt["cache_salt"]:
                raise ValueError(f"two cache salts: {prompt['cache_salt']!r} in the prompt and "
                                 f"{cache_salt!r} given")
            cache_salt = prompt["cache_salt"]
        prompt = inner
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string or None, got {cache_salt!r}")
    return prompt, cache_salt


class InputProcessor:
    def __init__(self, spec: ModelSpec, tokenizer, config: EngineConfig,
                 semantics: EngineSemantics | None = None):
        self.spec = spec
        self.semantics = semantics or semantics_of(config.semantics)
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = resolve_max_model_len(config.max_model_len, spec.max_model_len)

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        prompt = unpack_prompt(prompt)[0]
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: give the prompt as a list of token ids")
            # the tokenizer's own special tokens, as vLLM's InputPreprocessor and transformers'
            # tokenizer(prompt) add them (a BOS from add_bos_token or from tokenizer.json's
            # post-processor, as Llama 3's)
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise ValueError("the prompt is empty after tokenization")
            return ids
        if isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ValueError("the prompt is empty")
            bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool)
                   or not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {self.spec.vocab_size}); "
                                 f"got {bad[:5]}")
            return list(prompt)
        raise ValueError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")

    def _limit(self) -> str:
        """The length limit, named for a refusal."""
        if self.config.max_model_len is not None:
            return f"max_model_len ({self.max_model_len} tokens)"
        text = f"the model's context of {self.max_model_len} tokens"
        if self.spec.sliding_window == self.max_model_len:
            text += (" (its sliding_window: this engine's attention is full attention, which "
                     "equals the model's only within the window)")
        return text

    def check(self, prompt: str | list[int], params: SamplingParams | None
              ) -> tuple[list[int], SamplingParams]:
        """Validate a request without touching any state; returns (token ids, params)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        ids = self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; {self._limit()} leaves no room "
                             "for a new token")
        room = self.max_model_len - len(ids)
        if params.max_tokens is None or params.max_tokens > room:
            # vLLM takes the request and generates up to max_model_len, finishing it with
            # "length" (v1 check_stop: num_tokens >= max_model_len; v0's StopChecker too):
            # the same as a max_tokens of what is left, which is also what vLLM's
            # max_tokens=None means (InputProcessor: max_model_len - prompt length)
            params = dataclasses.replace(params, max_tokens=room,
                                         min_tokens=min(params.min_tokens, room))
        self.semantics.check_prompt(self.config, len(ids))
        if params.beam_width > 1 and 2 * params.beam_width > self.spec.vocab_size:
            raise ValueError(f"beam_width {params.beam_width} is too large for a vocabulary of "
                             f"{self.spec.vocab_size}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (this model has none)")
        outside = [t for t in params.stop_token_ids or () if t >= self.spec.vocab_size]
        if outside:
            raise ValueError(f"stop_token_ids must be token ids in [0, {self.spec.vocab_size}); "
                             f"got {outside[:5]}")
        self.semantics.check_request(self.config, len(ids), params)
        return ids, params
