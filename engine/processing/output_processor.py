"""Sampled tokens in, sequences out: append, fork (n > 1), stop checks, finish, the beam step.

After the forward pass every scheduled group asks for tokens (``sampler.py`` answers all of them
on the logits' device at once); this module applies the answers:
- greedy / sampled sequences append their token; an n > 1 group forks its n samples from the
  prompt's sequence at its first sample (vLLM v0: the children share every block);
- a sequence stops at ``max_tokens``, at any EOS id the model lists, or when its text contains
  a stop string (vLLM's semantics: the text is cut before the stop string; the tokens stay);
- beam search: transformers' scoring (``generate(num_beams=k)``: cumulative logprob, the best
  ``max(2, 1 + #EOS) * k`` extensions looked at, an EOS or stop-string extension ranked within
  the top k becomes a finished hypothesis, ``length_penalty``, ``early_stopping``) with vLLM
  v0's memory rules (survivors fork from their parent and share its blocks; pruned beams free
  theirs in the same step).
Text is detokenized incrementally (``detokenizer.py``) and stop strings are searched only in the
tail the new token could complete.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch

import engine.events as ev
from engine.processing.beam_search import beam_score, is_done, num_candidates, select_candidates
from engine.core.kv_cache_base import KVCacheBase
from engine.processing.detokenizer import DetokState, detokenize_step
from engine.outputs import CompletionOutput, RequestOutput
from engine.processing.sampler import BeamAsk, TokenAsk, sample_step
from engine.sched.interface import ScheduledBatch
from engine.core.sequence import Sequence, SequenceGroup, SeqStatus


def find_stop(text: str, new: str, stops) -> tuple[int, str] | None:
    """Where the first stop string, in the list's order, that ends inside the newly emitted
    text starts, and which one it is; or None (vLLM's check_stop_strings, v1 detokenizer / v0
    StopChecker: the first listed one that matches wins, not the earliest in the text). Only
    ``text``'s last ``len(new) + len(stop) - 1`` characters can hold one the previous steps
    have not seen."""
    if not new or not stops:
        return None
    for stop in stops:
        i = text.find(stop, max(0, len(text) - len(new) - len(stop) + 1))
        if i >= 0:
            return i, stop
    return None


def cut_at_stop(text: str, hit: tuple[int, str], include: bool) -> str:
    """The text a stop string ends with: cut before it, or after it with
    ``include_stop_str_in_output`` (vLLM drops whatever follows the stop string either way)."""
    at, stop = hit
    return text[:at + len(stop)] if include else text[:at]


class OutputProcessor:
    # ``bm.fork`` is called only for v0 groups (n > 1 / beams): v1 splits them into child
    # requests before they reach the output processor
    def __init__(self, bm: KVCacheBase, eos_token_ids: tuple[int, ...], tokenizer,
                 emit: Callable[[ev.Event], None], new_seq_id: Callable[[], int],
                 stop_strings_after_min_tokens: bool = False):
        self.bm = bm
        # a stop string may end a sequence from output token min_tokens on in v0 (StopChecker:
        # "output_len < min_tokens: no check"), but only after it in v1 (its detokenizer checks
        # stop strings once len(output) > min_tokens, in the text after the min_tokens-th token)
        self.stop_strings_later = stop_strings_after_min_tokens
        self.eos = frozenset(eos_token_ids)
        # vLLM stops at the tokenizer's EOS with no stop_reason; any other EOS id the model
        # lists joins the request's stop_token_ids (SamplingParams.update_from_generation_config),
        # so ending there reports that id as the stop_reason (without a tokenizer, every one)
        self.primary_eos = getattr(tokenizer, "eos_token_id", None)
        self.tokenizer = tokenizer
        self.emit = emit
        self.new_seq_id = new_seq_id
        self._detok: dict[int, DetokState] = {}     # seq_id -> incremental text state
        self._finish_order = itertools.count()       # groups' finishes, in the order they end

    # ---- one step's outputs -------------------------------------------------------------
    def process(self, batch: ScheduledBatch, logits: torch.Tensor, step_no: int) -> list[str]:
        """Apply this step's samples; returns the request ids that finished."""
        rows = {s.seq_id: i for i, s in enumerate(batch.seqs)}
        work = []
        for g in batch.groups:
            live = [s for s in g.seqs if s.seq_id in rows]
            if not live:
                continue
            p = g.params
            banned = self._banned(p, live[0].num_output_tokens)   # a group's seqs: one length
            if p.use_beam_search:
                asks = [BeamAsk([rows[s.seq_id] for s in live], [s.cumulative_logprob for s in live],
                                num_candidates(p.beam_width, len(self._stop_ids(p))), banned)]
            elif p.n > 1 and not g.forked:
                asks = [TokenAsk(rows[live[0].seq_id], p.n, p, g.generator, banned)]
            else:
                asks = [TokenAsk(rows[s.seq_id], 1, p, g.generator, banned) for s in live]
            work.append((g, live, asks))
        answers = iter(sample_step(logits, [a for _, _, asks in work for a in asks]))
        finished = []
        for g, live, asks in work:
            got = [next(answers) for _ in asks]
            if g.params.use_beam_search:
                self._beam_step(g, live, got[0], step_no)
            elif g.params.n > 1 and not g.forked:
                parent, picks = live[0], got[0]
                children = [parent] + [self._fork(g, parent, step_no) for _ in picks[1:]]
                g.forked = True
                for child, (tok, lp) in zip(children, picks):
                    self._append(g, child, tok, lp)
            else:
                for s, picks in zip(live, got):
                    self._append(g, s, *picks[0])
            if g.is_finished:
                finished.append(g.request_id)
        return finished

    def _fork(self, g: SequenceGroup, parent: Sequence, step_no: int) -> Sequence:
        child = Sequence(self.new_seq_id(), g.request_id, list(parent.token_ids),
                         parent.prompt_len, parent_seq_id=parent.seq_id, born_step=step_no + 1,
                         status=parent.status, cumulative_logprob=parent.cumulative_logprob,
                         output_text=parent.output_text, cache_salt=parent.cache_salt)
        self.bm.fork(parent, child)
        self._detok[child.seq_id] = self._state(parent).copy()
        g.seqs.append(child)
        return child

    def _state(self, s: Sequence) -> DetokState:
        state = self._detok.get(s.seq_id)
        if state is None:
            state = self._detok[s.seq_id] = DetokState(prefix=s.prompt_len, read=s.prompt_len)
        return state

    def _emit_text(self, s: Sequence) -> str:
        """Detokenize the newest token; returns the new text (and updates output_text)."""
        state = self._state(s)
        new = detokenize_step(self.tokenizer, s.token_ids, state)
        s.output_text = state.text
        return new

    # ---- stop rules (vLLM's SamplingParams: stop_token_ids, min_tokens) -------------------
    def _stop_ids(self, p) -> frozenset[int]:
        """The token ids that end a sequence under ``p``: its stop tokens, and the model's EOS
        ids unless ``ignore_eos``."""
        ids = frozenset() if p.ignore_eos else self.eos
        return ids | frozenset(p.stop_token_ids) if p.stop_token_ids else ids

    def _banned(self, p, output_len: int) -> tuple[int, ...]:
        """What may not be sampled now: before ``min_tokens`` output tokens, every EOS id and
        stop token (vLLM's ``all_stop_token_ids``, EOS ids included even with ignore_eos:
        v1 MinTokensLogitsProcessor, v0 _apply_min_tokens_penalty)."""
        if output_len >= p.min_tokens:
            return ()
        return tuple(sorted(self.eos | frozenset(p.stop_token_ids or ())))

    def _stop_strings_from(self, p) -> int:
        """The output length from which a stop string may end a sequence (see __init__)."""
        return p.min_tokens + 1 if self.stop_strings_later and p.min_tokens else p.min_tokens

    def _token_stop(self, p, token: int) -> tuple[bool, int | None]:
        """Whether ``token`` ends a sequence (an EOS id or a stop token), and its stop_reason."""
        if not p.ignore_eos and token in self.eos:
            return True, None if token == self.primary_eos else token
        if p.stop_token_ids and token in p.stop_token_ids:
            return True, token
        return False, None

    def _append(self, g: SequenceGroup, s: Sequence, token: int, logprob: float) -> None:
        s.token_ids.append(token)
        s.cumulative_logprob += logprob
        self.emit(ev.Sample(s.seq_id, token, logprob))
        p = g.params
        # Nothing stops a sequence before min_tokens; then an EOS or stop token, then stop
        # strings, then the length cap, as vLLM checks them (v1: vllm/v1/core/sched/utils.py
        # check_stop, with a stop string found by the detokenizer overriding "length"; v0:
        # StopChecker.maybe_stop_sequence): an EOS, stop token or stop string completed by the
        # max_tokens-th token is a "stop". A stop token's text and a stop string are left out
        # of the text unless include_stop_str_in_output (v1 Detokenizer.update(stop_terminated)).
        may_stop = s.num_output_tokens >= p.min_tokens
        stops, reason = self._token_stop(p, token) if may_stop else (False, None)
        if stops:              # the stop token's text is emitted only if it is to be kept
            if p.include_stop_str_in_output:
                self._emit_text(s)
            self.finish(g, s, "stop", stop_reason=reason)
            return
        new = self._emit_text(s)
        if p.stop and s.num_output_tokens >= self._stop_strings_from(p):
            hit = find_stop(s.output_text, new, p.stop)
            if hit is not None:
                self.finish(g, s, "stop", stop_reason=hit[1],
                            text=cut_at_stop(s.output_text, hit, p.include_stop_str_in_output))
                return
        if s.num_output_tokens >= p.max_tokens:
            self.finish(g, s, "length")

    def finish(self, g: SequenceGroup, s: Sequence, reason: str,
               status: SeqStatus = SeqStatus.FINISHED, text: str | None = None,
               stop_reason: int | str | None = None) -> None:
        """End a live sequence: free its blocks, record why; ``text`` overrides its final text
        (a stop string cuts it). A character still incomplete at the end is left out, as vLLM's
        detokenizer never emits one (v1 ``decode_next`` / ``detokenize_incrementally``)."""
        s.stop_reason = stop_reason
        if text is not None:
            s.output_text = text
        self.bm.free(s)
        s.status = status
        s.finish_reason = reason
        g.seqs.remove(s)
        g.done_seqs.append(s)
        if not g.seqs:           # the group's last live sequence: the request has finished
            g.finish_order = next(self._finish_order)
        self._detok.pop(s.seq_id, None)
        self.emit((ev.BeamPrune if status == SeqStatus.PRUNED else ev.Finish)(s.seq_id, reason))

    # ---- beam search --------------------------------------------------------------------
    def _stopping(self, g: SequenceGroup, parent: Sequence, token: int):
        """Does extending ``parent`` by ``token`` end a hypothesis? (False, or the finished
        hypothesis's (text, stop_reason), by the rules of ``_append``.)"""
        p = g.params
        out_len = parent.num_output_tokens + 1
        stops, reason = self._token_stop(p, token) if out_len >= p.min_tokens else (False, None)
        strings = p.stop and out_len >= self._stop_strings_from(p)
        if not (stops or strings):
            return False
        state = self._state(parent).copy()
        if stops and not p.include_stop_str_in_output:
            return state.text, reason
        ids = parent.token_ids + [token]
        new = detokenize_step(self.tokenizer, ids, state)
        if stops:
            return state.text, reason
        hit = find_stop(state.text, new, p.stop)
        if hit is None:
            return False
        return cut_at_stop(state.text, hit, p.include_stop_str_in_output), hit[1]

    def _beam_step(self, g: SequenceGroup, live: list[Sequence],
                   ranked: list[tuple[int, int, float]], step_no: int) -> None:
        p = g.params
        out_len = live[0].num_output_tokens + 1        # every live beam, after this token
        ends = [self._stopping(g, live[parent], tok) for parent, tok, _ in ranked]
        running, new_finished = select_candidates(ranked, p.beam_width, ends)
        for c, (text, stop_reason) in new_finished:   # a finished hypothesis: data, no blocks
            parent = live[c.parent]
            hyp = Sequence(self.new_seq_id(), g.request_id, parent.token_ids + [c.token_id],
                           parent.prompt_len, parent_seq_id=parent.seq_id,
                           born_step=step_no + 1, status=SeqStatus.FINISHED,
                           cumulative_logprob=c.cum_logprob, finish_reason="stop",
                           stop_reason=stop_reason, output_text=text)
            g.done_seqs.append(hyp)
            self.emit(ev.Finish(hyp.seq_id, "stop"))
        # survivors: a parent's first child continues in the parent's own sequence; further
        # children fork from it (sharing all its blocks); parents with no child are pruned
        by_parent: dict[int, list] = {}
        for c in running:
            by_parent.setdefault(c.parent, []).append(c)
        updates = []
        for idx, cands in by_parent.items():
            parent = live[idx]
            updates += [(self._fork(g, parent, step_no), c, parent.cumulative_logprob)
                        for c in cands[1:]]
            updates.append((parent, cands[0], parent.cumulative_logprob))
        for idx, s in enumerate(live):
            if idx not in by_parent:
                self.finish(g, s, "pruned", SeqStatus.PRUNED)
        for s, c, parent_cum in updates:
            s.token_ids.append(c.token_id)
            s.cumulative_logprob = c.cum_logprob
            self.emit(ev.Sample(s.seq_id, c.token_id, c.cum_logprob - parent_cum))
            self._emit_text(s)
        hyp_scores = [beam_score(h.cumulative_logprob, h.num_output_tokens, p.length_penalty)
                      for h in g.done_seqs if h.status == SeqStatus.FINISHED]
        best_running = max((s.cumulative_logprob for s in g.seqs), default=None)
        if (out_len >= p.max_tokens or best_running is None
                or is_done(hyp_scores, best_running, out_len, p)):
            for s in list(g.seqs):
                self.finish(g, s, "length" if out_len >= p.max_tokens else "beam_done")

    # ---- results ------------------------------------------------------------------------
    @staticmethod
    def request_output(g: SequenceGroup) -> RequestOutput:
        p = g.params
        if p.use_beam_search:
            # as transformers: a search that stops early returns its finished hypotheses only
            # (the beams still running then, "beam_done", are dropped); one that reaches
            # max_tokens counts its last beams as finished ("length")
            hyps = [s for s in g.done_seqs if s.status == SeqStatus.FINISHED
                    and s.finish_reason != "beam_done"] + g.seqs
            hyps.sort(key=lambda s: -beam_score(s.cumulative_logprob, len(s.output_token_ids),
                                               p.length_penalty))
            chosen = hyps[:p.beam_width]
        else:
            chosen = sorted((s for s in g.all_seqs() if s.status != SeqStatus.PRUNED),
                            key=lambda s: s.seq_id)
        # while a sequence runs, the last len(longest stop string) - 1 characters are held
        # back: they may be the start of a stop string that will be cut (vLLM's
        # stop_buffer_length / output_text_buffer_length), so a text read mid-run is always
        # the start of the final one
        hold = (max(map(len, p.stop)) - 1 if p.stop and not p.include_stop_str_in_output else 0)
        outs = [CompletionOutput(i, s.output_text[:-hold] if hold and not s.is_finished
                                 else s.output_text, list(s.output_token_ids),
                                 s.cumulative_logprob, s.finish_reason, s.seq_id, s.stop_reason)
                for i, s in enumerate(chosen)]
        return RequestOutput(g.request_id, g.prompt, list(g.prompt_token_ids), outs, g.is_finished,
                             g.num_cached_tokens)
