"""Requests in: tokenization and validation, before anything in the engine changes.

A request "fits" when its worst case fits the pool: the prompt's full blocks shared by all its
sequences, plus each live sequence's own blocks for the rest of its longest possible length.
That length is ``prompt + max_tokens - 1`` tokens of K/V, not ``prompt + max_tokens``: the
last sampled token is returned but never fed back, so its K/V is never written (DESIGN §2).
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.models.spec import ModelSpec
from engine.sampling_params import SamplingParams


def kv_tokens_at_most(prompt_len: int, max_tokens: int) -> int:
    """Most tokens one sequence of this request ever holds in the KV cache."""
    return prompt_len + max_tokens - 1


def blocks_needed_worst_case(prompt_len: int, params: SamplingParams, block_size: int) -> int:
    """Blocks one request can hold at its longest: the prompt's full blocks shared, every live
    sequence owning the rest of its blocks."""
    shared = prompt_len // block_size
    per_seq = -(-kv_tokens_at_most(prompt_len, params.max_tokens) // block_size) - shared
    return shared + params.width * per_seq


BEAM_SEARCH_IN_V1 = (
    "beam search is not part of vLLM v1's engine core: vLLM moved it out of the scheduler into "
    "its entry point (LLM.beam_search), which submits one single-token request per beam at every "
    "step and lets the prefix cache share the beams' blocks. This lab's v1 engine refuses it; "
    "choose semantics='v0' to see beam search's forks and copy-on-write in the engine.")


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
    def __init__(self, spec: ModelSpec, tokenizer, config: EngineConfig):
        self.spec = spec
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
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"{self._limit()}")
        budget = self.config.max_num_batched_tokens
        if self.config.semantics == "v0" and len(ids) > budget:
            # v0 prefills a prompt in one step (no chunking), so vLLM v0's prompt limit is
            # min(max_model_len, max_num_batched_tokens) (Scheduler._get_prompt_limit)
            raise ValueError(f"the prompt has {len(ids)} tokens but v0 prefills a prompt in one "
                             f"step of at most max_num_batched_tokens ({budget}) tokens")
        if params.beam_width > 1 and 2 * params.beam_width > self.spec.vocab_size:
            raise ValueError(f"beam_width {params.beam_width} is too large for a vocabulary of "
                             f"{self.spec.vocab_size}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (this model has none)")
        outside = [t for t in params.stop_token_ids or () if t >= self.spec.vocab_size]
        if outside:
            raise ValueError(f"stop_token_ids must be token ids in [0, {self.spec.vocab_size}); "
                             f"got {outside[:5]}")
        cfg = self.config
        if cfg.semantics == "v1":
            if params.use_beam_search:
                raise ValueError(BEAM_SEARCH_IN_V1)
            # each of the n child requests must fit alone (the others can be preempted), in
            # every block but the null block
            need = -(-kv_tokens_at_most(len(ids), params.max_tokens) // cfg.block_size)
            usable, width = cfg.num_gpu_blocks - 1, ""
            pool = f"{usable} usable blocks (block 0 is v1's null block)"
        else:
            need = blocks_needed_worst_case(len(ids), params, cfg.block_size)
            usable = cfg.num_gpu_blocks
            width = f" x {params.width} sequences" if params.width > 1 else ""
            pool = f"only {usable}"
        if need > usable:
            raise ValueError(
                f"this request can need {need} KV blocks ({len(ids)} prompt + {params.max_tokens} "
                f"new tokens{width}, block_size {cfg.block_size}) but the pool has {pool}: it "
                "could never run. Raise num_gpu_blocks or lower max_tokens / n / beam_width.")
        # v0 schedules a group's sequences together, so a wider group would wait forever; v1's
        # n child requests are scheduled one by one (vllm/v1/engine/parallel_sampling.py), so
        # there the extra children simply queue
        if cfg.semantics == "v0" and params.width > cfg.max_num_seqs:
            raise ValueError(f"n/beam_width {params.width} exceeds max_num_seqs "
                             f"{cfg.max_num_seqs}")
        return ids, params
