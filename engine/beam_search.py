"""One step of beam search over a request's live beams (vLLM v0 / transformers semantics).

Scoring as transformers' ``generate(num_beams=k, do_sample=False)`` defaults: candidates are
ranked by cumulative log-probability; the 2k best are looked at, an end-of-sequence candidate
ranked within the top k becomes a finished hypothesis, the k best others continue. A finished
hypothesis is scored cum_logprob / output_len ** length_penalty; with early_stopping=False the
search ends when no running beam can still beat the worst of k finished hypotheses.
"""
from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Candidate:
    parent: int          # index of the live beam it extends
    token_id: int
    cum_logprob: float


def beam_score(cum_logprob: float, output_len: int, length_penalty: float) -> float:
    return cum_logprob / (max(output_len, 1) ** length_penalty)


def num_candidates(width: int, num_eos: int) -> int:
    """How many ranked extensions a step looks at: transformers keeps
    ``max(2, 1 + n_eos) * num_beams`` (``_beam_search``), so enough non-EOS candidates remain
    even if every EOS id ranks high."""
    return max(2, 1 + num_eos) * width


def select_candidates(ranked: list[tuple[int, int, float]], width: int,
                      eos_token_ids) -> tuple[list[Candidate], list[Candidate]]:
    """From ``ranked`` (beam index, token id, cumulative logprob), best first, return
    (running, finished): up to ``width`` beams to continue and new EOS hypotheses (an EOS
    candidate counts only when it ranks within the top ``width``)."""
    running, finished = [], []
    for rank, (parent, token, score) in enumerate(ranked):
        cand = Candidate(parent, token, score)
        if token in eos_token_ids:
            if rank < width:
                finished.append(cand)
        elif len(running) < width:
            running.append(cand)
    return running, finished


def is_done(finished_scores: list[float], best_running_cum: float, output_len: int,
            width: int, length_penalty: float) -> bool:
    """early_stopping=False heuristic: k hypotheses exist and none can be beaten any more."""
    if len(finished_scores) < width:
        return False
    worst = sorted(finished_scores, reverse=True)[width - 1]
    return worst >= beam_score(best_running_cum, output_len, length_penalty)
