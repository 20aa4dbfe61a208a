"""Token choice for one step, on the logits' device: greedy, temperature, top-k, top-p, beams.

Only what the engine needs crosses to the host: the chosen token ids with their logprobs, and
for beam search the top candidates. Everything one step asks for is packed into a single
float64 tensor and copied once (token ids < 2**53 and float32 logprobs are exact in float64),
so a step pays one small device->host copy, never the ``[batch, vocab]`` logits (with a 128k
vocabulary those are ~0.5 MB per sequence per step).

A sampled token is drawn as vLLM v1 draws it (``vllm_random.py``: on a CPU the Gumbel-max race
with vLLM's hashed noise, on a GPU the exponential race), from each request's own
``torch.Generator`` on the sampling device, so a seeded request gives vLLM's tokens wherever the
two models' logits agree. A CPU and a CUDA generator give different streams, as in vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.processing.vllm_random import vllm_sample
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


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                  num_samples: int = 1) -> torch.Tensor:
    """``num_samples`` token ids (a tensor on the logits' device) from one row of logits."""
    if params.is_greedy:
        return torch.argmax(logits).reshape(1).expand(num_samples)
    # vLLM: float32 logits divided by the temperature, top-k / top-p masked, then the race;
    # several samples from one row (v0's n > 1 fork) are several races, one after another
    scaled = filter_top_k_top_p(logits.float() / params.temperature, params.top_k, params.top_p)
    return torch.stack([vllm_sample(scaled, generator) for _ in range(num_samples)])


@dataclass(frozen=True)
class TokenAsk:
    """``count`` tokens for row ``row`` (n > 1 forks draw all n from the parent's row), never
    one of ``banned`` (``min_tokens`` not reached: the stop tokens); the logprob reported is
    the model's own, before the ban (vLLM v1's default raw logprobs)."""
    row: int
    count: int
    params: SamplingParams
    generator: torch.Generator
    banned: tuple[int, ...] = ()


@dataclass(frozen=True)
class BeamAsk:
    """The ``count`` best (beam, token) extensions of the live beams in ``rows``, ranked by
    cumulative logprob ``cum_logprobs[i] + logprob(token | beam i)``; a ``banned`` token's
    logprob is -inf (transformers' ``min_new_tokens`` processor, applied to the beam scores)."""
    rows: list[int]
    cum_logprobs: list[float]
    count: int
    banned: tuple[int, ...] = ()


def _ban(logits: torch.Tensor, asks: list) -> torch.Tensor:
    """``logits`` with each ask's banned tokens at -inf in its rows (a copy, only if needed)."""
    bans = [(a.row, a.banned) for a in asks if isinstance(a, TokenAsk) and a.banned]
    if not bans:
        return logits
    logits = logits.clone()
    for row, ids in bans:
        logits[row, list(ids)] = float("-inf")
    return logits


def sample_step(logits: torch.Tensor, asks: list) -> list:
    """Answer every ask from this step's logits ([rows, vocab], any device).

    A TokenAsk gets ``[(token_id, logprob), ...]``; a BeamAsk gets
    ``[(beam_index, token_id, cum_logprob), ...]`` best first. Greedy asks share one batched
    argmax; sampled and beam asks run per request (each has its own generator / beams)."""
    if not asks:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    vocab = logits.shape[-1]
    logits = _ban(logits, asks)                  # what may be chosen (logprobs stay the model's)
    greedy = [a for a in asks if isinstance(a, TokenAsk) and a.params.is_greedy]
    pieces, sizes = [], {}
    if greedy:   # argmax over the whole batch (one pass, no row copies), then pick the rows
        best = logits.argmax(dim=-1)
        best_lp = logprobs.gather(1, best[:, None]).squeeze(1)
        if len(greedy) < logits.shape[0] or any(a.row != i for i, a in enumerate(greedy)):
            rows = torch.tensor([a.row for a in greedy], device=logits.device)
            best, best_lp = best[rows], best_lp[rows]
        pieces += [best.double(), best_lp.double()]
    for i, ask in enumerate(asks):
        if isinstance(ask, TokenAsk):
            if ask.params.is_greedy:
                continue
            toks = sample_tokens(logits[ask.row], ask.params, ask.generator, ask.count)
            pieces += [toks.double(), logprobs[ask.row, toks].double()]
            sizes[i] = ask.count
        else:
            cum = torch.tensor(ask.cum_logprobs, dtype=torch.float32, device=logits.device)
            beam_lp = logprobs[ask.rows]             # a copy: the ban stays in this ask
            if ask.banned:
                beam_lp[:, list(ask.banned)] = float("-inf")
            scores = (cum[:, None] + beam_lp).flatten()
            top = torch.topk(scores, min(ask.count, scores.numel()))
            pieces += [top.indices.double(), top.values.double()]
            sizes[i] = top.indices.numel()
    flat = torch.cat(pieces).tolist()            # the step's one device -> host copy
    at = 2 * len(greedy)
    greedy_answers = iter(zip(flat[:len(greedy)], flat[len(greedy):at]))
    out = []
    for i, ask in enumerate(asks):
        if i not in sizes:                       # a greedy ask: its argmax, count times
            tok, lp = next(greedy_answers)
            out.append([(int(tok), lp)] * ask.count)
            continue
        n = sizes[i]
        first, second = flat[at:at + n], flat[at + n:at + 2 * n]
        at += 2 * n
        if isinstance(ask, TokenAsk):
            out.append([(int(t), lp) for t, lp in zip(first, second)])
        else:
            out.append([(int(j) // vocab, int(j) % vocab, sc) for j, sc in zip(first, second)])
    return out
