"""Seeded synthetic request traces shaped like the vLLM paper's datasets, and a trace driver.

Lengths are log-normal (long right tail, as chat/instruction data are) with the mean matched to
the paper's Fig. 11 statistics; arrivals are a Poisson process in engine steps. The traces are
synthetic: only their means (and a chosen spread) match the real datasets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    mean_input: float
    mean_output: float
    sigma_input: float        # log-space standard deviation
    sigma_output: float


# vLLM paper (Kwon et al., SOSP 2023), Fig. 11: mean input / output lengths
SHAREGPT = WorkloadSpec("sharegpt", 161.31, 337.99, 0.9, 0.9)
ALPACA = WorkloadSpec("alpaca", 19.31, 58.45, 0.6, 0.8)
WORKLOADS = {w.name: w for w in (SHAREGPT, ALPACA)}


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    mu = math.log(mean) - sigma ** 2 / 2          # E[exp(N(mu, sigma))] == mean
    return rng.lognormal(mu, sigma, n)


def synthetic_trace(spec: WorkloadSpec, num_requests: int, rate_per_step: float, seed: int = 0,
                    max_model_len: int = 2048) -> pd.DataFrame:
    """Columns: arrival_step, prompt_len, output_len (prompt + output <= max_model_len)."""
    if num_requests < 1 or rate_per_step <= 0:
        raise ValueError("num_requests must be >= 1 and rate_per_step > 0")
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(_lognormal(rng, spec.mean_input, spec.sigma_input, num_requests)),
                     1, max_model_len // 2).astype(int)
    output = np.rint(_lognormal(rng, spec.mean_output, spec.sigma_output, num_requests))
    output = np.clip(output, 1, max_model_len - prompt).astype(int)
    arrivals = np.floor(np.cumsum(rng.exponential(1.0 / rate_per_step, num_requests))).astype(int)
    return pd.DataFrame({"arrival_step": arrivals, "prompt_len": prompt, "output_len": output})


def prompt_ids(length: int, request_index: int, vocab_size: int) -> list[int]:
    """Distinct, deterministic token ids (no accidental shared prefixes between requests)."""
    return [(request_index * 7919 + 31 * j) % (vocab_size - 4) + 4 for j in range(length)]


def run_trace(engine, trace: pd.DataFrame, make_params: Callable[[int], SamplingParams] | None = None,
              on_step: Callable[[int, int], None] | None = None, max_steps: int = 1_000_000,
              on_result: Callable | None = None) -> int:
    """Feed the trace to ``engine`` at its arrival steps and step until everything finished.

    ``make_params(output_len)`` builds each request's SamplingParams (default: exactly that
    many tokens, no early EOS). ``on_step(done, total)`` reports progress; ``on_result`` gets
    each StepResult. Returns the number of steps run.
    """
    make_params = make_params or (lambda out: SamplingParams(max_tokens=int(out), ignore_eos=True))
    rows = list(trace.itertuples(index=False))
    vocab = engine.spec.vocab_size
    i = steps = 0
    while i < len(rows) or engine.has_unfinished_requests():
        while i < len(rows) and rows[i].arrival_step <= steps:
            engine.add_request(prompt_ids(int(rows[i].prompt_len), i, vocab),
                               make_params(rows[i].output_len))
            i += 1
        result = engine.step()
        steps += 1
        if on_result:
            on_result(result)
        if on_step:
            on_step(engine.num_finished, len(rows))
        if steps >= max_steps:
            raise RuntimeError(f"trace did not finish within {max_steps} steps")
    return steps
