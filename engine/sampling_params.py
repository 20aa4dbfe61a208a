"""Per-request generation settings (vLLM-shaped), validated on construction."""
from __future__ import annotations

import math
from dataclasses import dataclass


GREEDY_BELOW = 1e-5        # vLLM's _SAMPLING_EPS
LEAST_TEMPERATURE = 1e-2   # vLLM's _MAX_TEMP: a smaller positive temperature is raised to it


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1                   # parallel samples sharing the prompt's blocks
    temperature: float = 0.0     # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1              # -1 or 0 = off (vLLM: 0 since v1, -1 before)
    max_tokens: int | None = 16     # None: up to max_model_len (vLLM's meaning)
    beam_width: int = 1          # > 1 = beam search (transformers' scoring, vLLM v0's memory)
    length_penalty: float = 1.0  # beam score = cum_logprob / output_len ** length_penalty
    # when beam search ends (transformers' generate): True = as soon as beam_width hypotheses
    # are finished; False = when no running beam can still beat the worst finished one at its
    # current length; "never" = the same, but a positive length_penalty assumes the best
    # running beam could reach max_tokens (the canonical beam search)
    early_stopping: bool | str = False
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    ignore_eos: bool = False
    # vLLM's names and defaults (vllm/sampling_params.py): token ids that end a sequence like an
    # EOS does (its finish reason "stop", its stop_reason the id); the fewest output tokens
    # before any EOS, stop token or stop string may end it (until then they cannot be sampled);
    # whether a stop string, or a stop token's text, stays in the output text
    stop_token_ids: tuple[int, ...] | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < LEAST_TEMPERATURE:
            # vLLM raises it (dividing logits by less could overflow): only 0 is greedy
            object.__setattr__(self, "temperature", LEAST_TEMPERATURE)
        if type(self.seed) is int and self.seed == -1:
            object.__setattr__(self, "seed", None)      # vLLM: seed=-1 means no seed
        if type(self.top_k) is int and self.top_k == 0:
            object.__setattr__(self, "top_k", -1)       # vLLM: 0 (or -1) considers all tokens
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, (list, tuple)):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif self.stop is not None:
            raise ValueError(f"invalid SamplingParams: stop must be a string or a list of strings, "
                             f"got {self.stop!r}")
        if isinstance(self.stop_token_ids, (list, tuple)):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        elif self.stop_token_ids is not None:
            raise ValueError(f"invalid SamplingParams: stop_token_ids must be a list of token ids, "
                             f"got {self.stop_token_ids!r}")
        problems = self.problems()
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems))

    def problems(self) -> list[str]:
        p = []
        if not isinstance(self.n, int) or self.n < 1:
            p.append(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            p.append(f"beam_width must be an integer >= 1, got {self.beam_width!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or math.isinf(t):
            p.append(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0 < self.top_p <= 1:
            p.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            p.append(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int)
                                            or isinstance(self.max_tokens, bool)
                                            or self.max_tokens < 1):
            p.append(f"max_tokens must be None (up to max_model_len) or an integer >= 1, "
                     f"got {self.max_tokens!r}")
        if not isinstance(self.length_penalty, (int, float)) or math.isnan(self.length_penalty):
            p.append(f"length_penalty must be a number, got {self.length_penalty!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2 ** 63):
            p.append(f"seed must be None or an integer in [0, 2**63), got {self.seed!r}")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            p.append(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.stop is not None and any(not isinstance(s, str) or not s for s in self.stop):
            p.append("stop must be a list of non-empty strings")
        if self.stop_token_ids is not None and any(
                not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            p.append(f"stop_token_ids must be token ids (integers >= 0), got {list(self.stop_token_ids)!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            p.append(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        elif isinstance(self.max_tokens, int) and 1 <= self.max_tokens < self.min_tokens:
            p.append(f"min_tokens must be at most max_tokens={self.max_tokens}, got {self.min_tokens}")
        if not isinstance(self.include_stop_str_in_output, bool):
            p.append(f"include_stop_str_in_output must be True or False, got "
                     f"{self.include_stop_str_in_output!r}")
        # settings that would have no effect are refused, as vLLM v0's _verify_beam_search /
        # _verify_non_beam_search did (rather than accepted and ignored)
        if not p and self.beam_width > 1:
            if self.n > 1:
                p.append("use either n > 1 (parallel sampling) or beam_width > 1, not both")
            if not self.is_greedy:
                p.append("beam search is deterministic: set temperature=0")
            if self.top_p < 1 or self.top_k != -1:
                p.append("beam search ranks every token: leave top_p at 1 and top_k off")
        if not p and self.beam_width == 1:
            if self.length_penalty != 1:
                p.append("length_penalty only scores beams: leave it at 1 without beam search")
            if self.early_stopping is not False:
                p.append("early_stopping only ends beam search: leave it False without beams")
        if not p and self.n > 1 and self.is_greedy:
            p.append("n > 1 with temperature 0 would give n identical samples: set temperature > 0")
        return p

    @property
    def is_greedy(self) -> bool:
        """Temperature 0 is greedy (below 1e-5, as vLLM; a smaller positive one became 0.01)."""
        return self.temperature < GREEDY_BELOW

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def width(self) -> int:
        """How many live sequences the request can have at once."""
        return max(self.n, self.beam_width)
