"""vLLM v1's scheduler: one token budget per step, no prefill or decode phases.

Follows vLLM's ``vllm/v1/core/sched/scheduler.py`` (FCFS policy; facts, not code):
- Every request has ``num_computed`` tokens in the cache and catches up to its ``num_tokens``.
  A step has a budget of ``max_num_batched_tokens`` tokens. Running requests go first, in
  admission order: a decoding one takes 1 token, one still prefilling its next prompt chunk.
  Then waiting requests, in queue order, take chunks of what is left (chunked prefill), each
  after a prefix-cache lookup. ``long_prefill_token_threshold`` (if > 0) caps one request's
  chunk, but only while more than one request is running or waiting: a lone request has nobody
  to starve and takes the whole budget. So one step can mix decode tokens and prefill chunks.
- A waiting request is admitted only if its whole prompt (its whole token list, for a
  preempted one) fits in the free blocks, not just this step's chunk
  (``scheduler_reserve_full_isl``, on by default, passed as ``full_sequence_must_fit`` to
  ``KVCacheManager.allocate_slots``): admitting a chunk that cannot finish would only be
  preempted later.
- A request samples only in the step that computes its last known token; a partial chunk's
  logits are thrown away.
- When the pool cannot give a running request its slots, the most recently admitted running
  request (the tail of ``running``) is preempted by recompute: its blocks freed, ``num_computed``
  back to 0, put at the front of the waiting queue. If that was the request itself, it is not
  scheduled. A step that preempted admits no waiting request. There is no swap.
- ``max_num_seqs`` caps the running requests.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import engine.events as ev
from engine.core.block_math import cdiv, slot_of
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence, SequenceGroup, SeqStatus
from engine.core.worst_case import kv_tokens_at_most, pool_too_small
from engine.processing.parallel_sampling import child_request_ids
from engine.sched.interface import EngineSemantics, ScheduledBatch, Scheduler

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

PREEMPT_RULE = ("vLLM v1 preempts the most recently admitted running request by recompute: "
                "its blocks are freed, its computed tokens reset to 0, and it goes to the front "
                "of the waiting queue; nothing new is admitted in this step")
RESET_RULE = ("reset_prefix_cache(reset_running_requests=True) preempts every running request "
              "by recompute, the most recently admitted first, each to the front of the waiting "
              "queue (so they resume in admission order), and then no block is in use")


class SchedulerV1(Scheduler):
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 long_prefill_token_threshold: int, emit: Callable[[ev.Event], None]):
        self.bm = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.emit = emit
        self.waiting: list[SequenceGroup] = []     # arrival order; preempted ones in front
        self.running: list[SequenceGroup] = []     # admission order: the tail is the victim
        self.num_preemptions = 0

    def add(self, group: SequenceGroup) -> None:
        assert len(group.seqs) == 1, "a v1 request has exactly one sequence"
        self.waiting.append(group)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def queues(self) -> dict[str, list[SequenceGroup]]:
        return {"waiting": self.waiting, "running": self.running}        # no swap in v1

    def remove(self, group: SequenceGroup) -> None:
        for q in (self.waiting, self.running):
            if group in q:
                q.remove(group)

    def num_running_seqs(self) -> int:
        return len(self.running)

    # ---- the step's plan ---------------------------------------------------------------
    def _chunk(self, seq: Sequence, computed: int, budget: int, threshold: int) -> int:
        num_new = seq.num_tokens - computed
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def schedule(self) -> ScheduledBatch:
        self.running = [g for g in self.running if not g.is_finished]
        batch = ScheduledBatch("idle")
        # the cap exists so a long prefill does not starve others; alone, it takes the budget
        # (vLLM 0.32 Scheduler.schedule: threshold if num_running + num_waiting > 1 else 0)
        threshold = (self.long_prefill_token_threshold
                     if len(self.running) + len(self.waiting) > 1 else 0)
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            g = self.running[i]
            seq = g.seqs[0]
            num_new = self._chunk(seq, seq.num_computed, budget, threshold)
            scheduled = True
            while not self.bm.allocate_slots(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is g:
                    scheduled = False
                    break
            if not scheduled:
                break
            self._add(batch, g, seq, num_new)
            budget -= num_new
            i += 1
        while not preempted and self.waiting and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            g = self.waiting[0]
            seq = g.seqs[0]
            hits = self.bm.get_computed_blocks(seq)
            computed = len(hits) * self.bm.block_size
            num_new = self._chunk(seq, computed, budget, threshold)
            # the whole token list must fit, not only this chunk (full_sequence_must_fit)
            if self.bm.blocks_to_allocate(seq, seq.num_tokens - computed, hits) \
                    > self.bm.gpu.num_free:
                break
            if not self.bm.allocate_slots(seq, num_new, hits):
                break
            self.bm.record_prefix_cache_stats(seq, len(hits))     # counted once, when admitted
            if g.num_cached_tokens is None:
                g.num_cached_tokens = len(hits) * self.bm.block_size
            self.waiting.pop(0)
            seq.status = SeqStatus.RUNNING
            self.running.append(g)
            self._add(batch, g, seq, num_new)
            budget -= num_new
        kinds = {"decode" if r.is_decode else "prefill" for r in batch.scheduled}
        batch.kind = "idle" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"
        batch.is_prefill = any(r.num_tokens > 1 for r in batch.scheduled)
        return batch

    def _add(self, batch: ScheduledBatch, g: SequenceGroup, seq: Sequence, num_new: int) -> None:
        start = seq.num_computed               # after any prefix hits
        end = start + num_new
        batch.add(g, seq, start, end)
        batch.slot_mapping += self.bm.slots(seq, start, end)
        if batch.scheduled[-1].is_decode:
            bs = self.bm.block_size
            b = seq.block_table[start // bs]
            self.emit(ev.Append(seq.seq_id, seq.token_ids[start], start // bs, b,
                                slot_of(seq.block_table, start, bs)))
        else:                                               # a prompt chunk (or a recompute)
            self.emit(ev.Prefill(seq.seq_id, start, end, seq.num_tokens))

    def preempt_all_running(self) -> None:
        """vLLM's ``Scheduler.reset_prefix_cache(reset_running_requests=True)``
        (vllm/v1/core/sched/scheduler.py): ``while running: preempt(running.pop())``."""
        while self.running:
            self._preempt(self.running.pop(), RESET_RULE)

    def _preempt(self, g: SequenceGroup, rule: str = PREEMPT_RULE) -> None:
        seq = g.seqs[0]
        self.emit(ev.Preempt(seq.seq_id, "recompute", rule))
        self.bm.free(seq)                       # also sets num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.insert(0, g)
        self.num_preemptions += 1
        seq.num_preemptions += 1


BEAM_SEARCH_IN_V1 = (
    "beam search is not part of vLLM v1's engine core: vLLM moved it out of the scheduler into "
    "its entry point (LLM.beam_search), which submits one single-token request per beam at every "
    "step and lets the prefix cache share the beams' blocks. This lab's v1 engine refuses it; "
    "choose semantics='v0' to see beam search's forks and copy-on-write in the engine.")


class V1Semantics(EngineSemantics):
    """vLLM v1: one token budget per step with chunked prefill, n > 1 as child requests sharing
    through the prefix cache, recompute-only preemption, a null block."""
    name = "v1"
    label = "vLLM v1"
    prefix_caching_default = True
    fixed_settings = {"enable_prefix_caching": True, "preemption_mode": "recompute"}
    has_swap = False
    has_beam_search = False
    chunks_prefills = True
    counts_preempted_lookups_apart = True
    stop_strings_after_min_tokens = True
    forks_sequences = False
    is_current_vllm = True
    reset_running_refusal = None

    def build(self, config: EngineConfig, emit):
        kv = KVCacheManager(config.num_gpu_blocks, config.block_size, config.prefix_caching,
                            emit)
        return kv, SchedulerV1(kv, config.max_num_seqs, config.max_num_batched_tokens,
                               config.long_prefill_token_threshold, emit)

    def config_problems(self, config: EngineConfig) -> list[str]:
        if config.preemption_mode == "swap":
            return ["preemption_mode='swap' is not available with semantics='v1': vLLM v1 "
                    "has no swap space and preempts by recompute only"]
        return []

    def check_request(self, config: EngineConfig, num_prompt_tokens: int,
                      params: SamplingParams) -> None:
        if params.use_beam_search:
            raise ValueError(BEAM_SEARCH_IN_V1)
        # each of the n child requests must fit alone (the others can be preempted), in every
        # block but the null block; the extra children simply queue
        # (vllm/v1/engine/parallel_sampling.py), so n may exceed max_num_seqs
        need = cdiv(kv_tokens_at_most(num_prompt_tokens, params.max_tokens), config.block_size)
        usable = config.num_gpu_blocks - 1
        if need > usable:
            raise ValueError(pool_too_small(need, num_prompt_tokens, params.max_tokens,
                                            config.block_size, "",
                                            f"{usable} usable blocks (block 0 is v1's null "
                                            f"block)"))

    def child_request_ids(self, request_id: str, params: SamplingParams) -> list[str]:
        return child_request_ids(request_id, params.n)
