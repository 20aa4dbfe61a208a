"""Continuous-batching scheduler: waiting / running / swapped queues, FCFS, preemption.

Each step is either a prefill step (newly admitted or recomputed requests) or a decode step
(one new token for every running sequence), as in vLLM v0. Priority is arrival order: a group
decodes only while the pool has a free block for each of its running sequences (vLLM v0's
worst-case ``can_append_slots``); when it has not, the latest-arrived running request is
preempted first, by
recompute (blocks freed, request requeued, prefilled again later) or by swap (blocks moved to
the CPU pool, moved back before any new request is admitted).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import engine.events as ev
from engine.core.block_manager import BlockManager
from engine.core.sequence import SequenceGroup, SeqStatus
from engine.core.worst_case import blocks_needed_worst_case, pool_too_small
from engine.sched.interface import EngineSemantics, ScheduledBatch, Scheduler

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams


def fanout(g: SequenceGroup) -> int:
    """Live sequences the group has once it has sampled: n (or beam_width) for a group that
    has not fanned out yet, else the sequences it has."""
    fresh = len(g.seqs) == 1 and not g.done_seqs and g.seqs[0].num_output_tokens == 0
    return g.params.width if fresh else len(g.seqs)


def first_decode_blocks(g: SequenceGroup, block_size: int) -> int:
    """Fresh blocks the group's first decode after its prefill takes (0 if it finishes at the
    prefill's sample). A fresh group with prompt P fans out to w sequences sharing P's blocks:
    w new blocks if P ends on a block boundary, else w - 1 copy-on-write copies (the last
    sharer writes in place). A recomputed group's sequences each own their partial last block."""
    generated = max(s.num_output_tokens for s in g.seqs)
    if generated + 1 >= g.params.max_tokens:
        return 0
    if fanout(g) != len(g.seqs):          # fresh n > 1 / beam group
        boundary = g.seqs[0].num_tokens % block_size == 0
        return g.params.width if boundary else g.params.width - 1
    return sum(1 for s in g.seqs if s.num_tokens % block_size == 0)


class SchedulerV0(Scheduler):
    def __init__(self, bm: BlockManager, preemption_mode: str, max_num_seqs: int,
                 max_num_batched_tokens: int, emit: Callable[[ev.Event], None]):
        self.bm = bm
        self.preemption_mode = preemption_mode
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.emit = emit
        self.waiting: list[SequenceGroup] = []     # kept in arrival order
        self.running: list[SequenceGroup] = []     # kept in arrival order
        self.swapped: list[SequenceGroup] = []     # kept in arrival order
        self.num_preemptions = 0                   # requests preempted (vLLM's metric)

    def add(self, group: SequenceGroup) -> None:
        self._insert(self.waiting, group)

    @staticmethod
    def _insert(queue: list[SequenceGroup], group: SequenceGroup) -> None:
        queue.append(group)
        queue.sort(key=lambda g: g.arrival)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def queues(self) -> dict[str, list[SequenceGroup]]:
        return {"waiting": self.waiting, "running": self.running, "swapped": self.swapped}

    def remove(self, group: SequenceGroup) -> None:
        for q in (self.waiting, self.running, self.swapped):
            if group in q:
                q.remove(group)

    def num_running_seqs(self) -> int:
        """Running sequences, counting a group that has not fanned out yet (n > 1 or beams
        before their first sample) at the width it will have after this step's sample."""
        return sum(fanout(g) for g in self.running)

    # ---- the step's plan ---------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        self.running = [g for g in self.running if not g.is_finished]
        swap_in = self._swap_in()
        if not self.swapped and not swap_in:
            batch = self._admit_prefills()
            if batch is not None:
                return batch
        return self._decode(swap_in)

    def _decode_need(self, seqs) -> int:
        """Free blocks a group's next decode needs: one per running sequence (vLLM v0's
        worst-case can_append_slots), at least the exact need."""
        return max(len(seqs), self.bm.blocks_needed_for_append(seqs))

    def _swap_in(self) -> list[tuple[int, int]]:
        mapping: list[tuple[int, int]] = []
        running_need = sum(self._decode_need(r.seqs) for r in self.running)
        while self.swapped:
            g = self.swapped[0]
            # room for its blocks and for its next token, so this step's decode cannot preempt
            # (a step never swaps both ways: the runner copies swap-outs before swap-ins)
            next_need = self._decode_need(g.seqs)
            need = self.bm.blocks_needed_for_swap_in(g.seqs) + next_need + running_need
            if need > self.bm.gpu.num_free:
                if not self.running and not mapping:
                    # nothing running can free blocks for it: recompute it (never deadlock)
                    self.swapped.pop(0)
                    self._recompute(g)
                    continue
                break
            if self.num_running_seqs() + len(g.seqs) > self.max_num_seqs:
                break
            self.swapped.pop(0)
            mapping += self.bm.swap_in(g.seqs)
            running_need += next_need
            self._insert(self.running, g)
        return mapping

    def _admit_prefills(self) -> ScheduledBatch | None:
        """Admit waiting groups (arrival order) while the pool holds their prefill, the blocks
        their first decode will need (a new block at a boundary, or the copy-on-write copies of
        a group that fans out), and the next decode of everything already running -- so a
        group admitted beside others is not preempted at the very next step (one admitted alone
        reserves only its exact first decode: see the comment below)."""
        batch = ScheduledBatch("prefill", is_prefill=True)
        tokens = 0
        # the next decode of everything running, counted by the decode rule (a free block per
        # running sequence). A group that would run alone reserves only its exact first
        # decode, so it is admitted even when the worst case cannot be had: it then progresses
        # through preemption and recompute, as under vLLM v0.
        reserved = sum(self._decode_need(r.seqs) for r in self.running)
        while self.waiting:
            g = self.waiting[0]
            first = g.seqs[0]
            # the budget counts computed tokens only, not those reused from the cache (vLLM's
            # _schedule_prefills: budget.can_schedule(num_new_tokens=num_new_tokens_uncached))
            needs = [self.bm.prefill_need(s, first if s is not first else None) for s in g.seqs]
            need, new_tokens = sum(b for b, _ in needs), sum(t for _, t in needs)
            then = first_decode_blocks(g, self.bm.block_size)
            worst_then = max(then, fanout(g))
            alone = not self.running and not batch.scheduled
            if need + (then if alone else worst_then) + reserved > self.bm.gpu.num_free:
                break
            if batch.scheduled and tokens + new_tokens > self.max_num_batched_tokens:
                break
            if self.num_running_seqs() + fanout(g) > self.max_num_seqs:
                break
            reserved += worst_then
            self.waiting.pop(0)
            for s in g.seqs:
                start = self.bm.allocate_for_prefill(s, first if s is not first else None)
                if s is first and g.num_cached_tokens is None:
                    g.num_cached_tokens = start
                s.status = SeqStatus.RUNNING
                batch.add(g, s, start, s.num_tokens)     # a prefill runs to the prompt's end
                batch.slot_mapping += self.bm.slots(s, start, s.num_tokens)
                self.emit(ev.Prefill(s.seq_id, start, s.num_tokens))
                tokens += s.num_tokens - start
            self._insert(self.running, g)
        return batch if batch.scheduled else None

    def _decode(self, swap_in: list[tuple[int, int]]) -> ScheduledBatch:
        batch = ScheduledBatch("decode", swap_in=swap_in)
        queue = list(self.running)          # arrival order: the tail is the first victim
        kept: list[SequenceGroup] = []
        while queue:
            g = queue.pop(0)
            preempted_self = False
            # vLLM v0's can_append_slots "worst-case heuristic": every running sequence needs
            # a free block before it decodes, even when its token fits in its last block
            # (get_num_blocks_touched_by_append_slots is >= 1); what is then allocated is the
            # exact need (a new block at a boundary, copy-on-write copies)
            while self._decode_need(g.seqs) > self.bm.gpu.num_free:
                victim = queue.pop() if queue else g
                # alone, a group swapped out could only come back to the same shortage: it is
                # recomputed instead (its prefill then samples its next token)
                alone = victim is g and not kept
                batch.swap_out += self._preempt(victim, swap=not alone)
                if victim is g:
                    preempted_self = True
                    break
            if preempted_self:
                continue
            for s in g.seqs:
                batch.slot_mapping.append(self.bm.append_slot(s))
                batch.add(g, s, s.num_computed, s.num_computed + 1)   # the newest token, fed back
            kept.append(g)
        self.running = kept
        assert not (swap_in and batch.swap_out), "a step never swaps both ways"
        batch.copies = self.bm.pending_copies
        self.bm.pending_copies = []
        if not batch.scheduled:
            batch.kind = "idle"
        return batch

    def preempt_all_running(self) -> None:
        """vLLM v0's ``reset_prefix_cache`` never preempts: refused, with the reason."""
        raise ValueError(V0Semantics.reset_running_refusal)

    def _preempt(self, g: SequenceGroup, swap: bool = True) -> list[tuple[int, int]]:
        self.num_preemptions += 1
        if swap and self.preemption_mode == "swap" and self.bm.can_swap_out(g.seqs):
            for s in g.seqs:
                self.emit(ev.Preempt(s.seq_id, "swap"))
            mapping = self.bm.swap_out(g.seqs)
            self._insert(self.swapped, g)
            return mapping
        self._recompute(g)           # also the fallback when swap space is full
        return []

    def _recompute(self, g: SequenceGroup) -> None:
        for s in g.seqs:
            self.emit(ev.Preempt(s.seq_id, "recompute"))
            self.bm.free(s)
            s.status = SeqStatus.WAITING
        self._insert(self.waiting, g)


class V0Semantics(EngineSemantics):
    """vLLM v0: separate prefill and decode steps, fork + copy-on-write, swap or recompute."""
    name = "v0"
    label = "vLLM v0"
    prefix_caching_default = False
    fixed_settings = {}
    has_swap = True
    has_beam_search = True
    chunks_prefills = False
    counts_preempted_lookups_apart = False
    stop_strings_after_min_tokens = False
    forks_sequences = True
    is_current_vllm = False
    reset_running_refusal = (
        "reset_running_requests=True is vLLM v1's (its scheduler preempts the running "
        "requests); this engine follows vLLM v0, whose reset_prefix_cache only resets when no "
        "block is in use")

    def build(self, config: EngineConfig, emit):
        bm = BlockManager(config.num_gpu_blocks, config.num_cpu_blocks, config.block_size,
                          config.prefix_caching, emit)
        return bm, SchedulerV0(bm, config.preemption_mode, config.max_num_seqs,
                               config.max_num_batched_tokens, emit)

    def check_prompt(self, config: EngineConfig, num_prompt_tokens: int) -> None:
        budget = config.max_num_batched_tokens
        if num_prompt_tokens > budget:
            # v0 prefills a prompt in one step (no chunking), so vLLM v0's prompt limit is
            # min(max_model_len, max_num_batched_tokens) (Scheduler._get_prompt_limit)
            raise ValueError(f"the prompt has {num_prompt_tokens} tokens but v0 prefills a "
                             f"prompt in one step of at most max_num_batched_tokens ({budget}) "
                             f"tokens")

    def check_request(self, config: EngineConfig, num_prompt_tokens: int,
                      params: SamplingParams) -> None:
        need = blocks_needed_worst_case(num_prompt_tokens, params.max_tokens, params.width,
                                        config.block_size)
        if need > config.num_gpu_blocks:
            width = f" x {params.width} sequences" if params.width > 1 else ""
            raise ValueError(pool_too_small(need, num_prompt_tokens, params.max_tokens,
                                            config.block_size, width,
                                            f"only {config.num_gpu_blocks}"))
        # v0 schedules a group's sequences together, so a wider group would wait forever
        if params.width > config.max_num_seqs:
            raise ValueError(f"n/beam_width {params.width} exceeds max_num_seqs "
                             f"{config.max_num_seqs}")

