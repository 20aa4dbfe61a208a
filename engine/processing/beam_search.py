"""Beam search scoring, as transformers' ``generate(num_beams=k, do_sample=False)`` does it.

Followed exactly (transformers 5.x ``GenerationMixin._beam_search`` and its helpers
``_get_top_k_continuations``, ``_update_finished_beams``, ``_check_early_stop_heuristic``,
``_beam_search_has_unfinished_sequences``):
- candidates (beam, token) are ranked by cumulative log-probability; the best
  ``max(2, 1 + #EOS ids) * k`` are looked at;
- a candidate that ends a hypothesis (an EOS id, or a stop string, transformers'
  ``stop_strings``) becomes a finished hypothesis only if it ranks within the top k; the k best
  other candidates continue;
- a finished hypothesis scores ``cum_logprob / output_len ** length_penalty``; the best k are
  returned, best first;
- the search ends at ``max_tokens``, or earlier per ``early_stopping``: True once k hypotheses
  are finished; False once k are finished and the best running beam, scored at its current
  length, cannot beat the worst of them; "never" the same, except that with a positive
  ``length_penalty`` the running beam is scored as if it reached ``max_tokens``.
What happens to memory is vLLM v0's (engine/processing/output_processor.py): survivors fork, pruned beams
free their blocks.
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
    """How many ranked extensions a step looks at (transformers' ``beams_to_keep``): enough
    non-ending candidates remain even if every EOS id ranks high."""
    return max(2, 1 + num_eos) * width


def select_candidates(ranked: list[tuple[int, int, float]], width: int, ends: list
                      ) -> tuple[list[Candidate], list[tuple[Candidate, object]]]:
    """From ``ranked`` (beam index, token id, cumulative logprob), best first, and ``ends[i]``
    (False, or what a finished hypothesis keeps, when candidate i ends one), return
    (running, finished): up to ``width`` beams to continue and the new finished hypotheses."""
    running, finished = [], []
    for rank, ((parent, token, score), end) in enumerate(zip(ranked, ends)):
        cand = Candidate(parent, token, score)
        if end is not False:
            if rank < width:
                finished.append((cand, end))
        elif len(running) < width:
            running.append(cand)
    return running, finished


def is_done(finished_scores: list[float], best_running_cum: float, output_len: int,
            params) -> bool:
    """Whether the search ends before max_tokens (``params.early_stopping``, see above)."""
    width, penalty = params.beam_width, params.length_penalty
    if len(finished_scores) < width:
        return False
    if params.early_stopping is True:
        return True
    best_len = params.max_tokens if params.early_stopping == "never" and penalty > 0 else output_len
    worst = sorted(finished_scores, reverse=True)[width - 1]
    return worst >= beam_score(best_running_cum, best_len, penalty)
