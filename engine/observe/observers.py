"""Things that only watch the engine: the contiguous baselines and the snapshot history.

The engine calls every observer after each change it makes -- a request added, a request
aborted, a step done -- and never reads anything back except the snapshot the recorder made.
``EngineConfig(observe=False)`` (and ``Engine.generate``) runs with no observers at all, so
plain generation pays nothing for snapshots, history or baselines.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.observe.accounting import Accounting, Slab, accounting_frame, baseline_accounting
from engine.observe.baselines import POLICIES, ContiguousAllocator
from engine.events import Event
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_base import KVCacheBase
from engine.core.sequence import SequenceGroup
from engine.observe.snapshot import PoolContents, PrefixCacheCounts, SeqState, \
    SnapshotHistory, StepSnapshot, step_snapshot


def _queue_lengths(scheduler) -> tuple[int, int, int]:
    """(waiting, running, swapped) requests; 0 swapped for a scheduler without swap."""
    q = scheduler.queues()
    return len(q["waiting"]), len(q["running"]), len(q.get("swapped", ()))


@dataclass(frozen=True)
class StepRecord:
    """What one engine step did, as observers see it."""
    step: int
    kind: str                        # prefill / decode / mixed (v1) / idle, or reset (not a step)
    events: tuple[Event, ...]
    finished: tuple[str, ...]        # request ids finished in this step
    step_time_s: float


class Observer:
    def on_add(self, engine, group: SequenceGroup) -> None:
        pass

    def on_abort(self, engine, request_id: str, events: tuple[Event, ...]) -> None:
        pass

    def on_step(self, engine, record: StepRecord) -> None:
        pass


class ContiguousBaselines(Observer):
    """The same request stream under each contiguous allocator (Max / Pow2 / Oracle), stepped
    in lockstep with the engine; a request that finishes early (EOS, stop) shrinks to the
    length it really had, as the Oracle allocator would have known.

    ``add`` / ``abort`` / ``finish`` / ``step`` take plain values, so real vLLM's snapshots
    (real_vllm/snapshots.py) run the same baselines; the observer hooks feed them our
    engine's."""

    def __init__(self, capacity_slots: int, max_model_len: int):
        self.allocators = {p: ContiguousAllocator(p, capacity_slots, max_model_len)
                           for p in POLICIES}

    # ---- plain values --------------------------------------------------------------------
    def add(self, request_id: str, prompt_len: int, max_tokens: int, width: int = 1) -> None:
        for a in self.allocators.values():
            a.add(request_id, prompt_len, max_tokens, width)

    def abort(self, request_ids) -> None:
        for rid in request_ids:
            for a in self.allocators.values():
                a.abort(rid)

    def finish(self, request_id: str, output_len: int, max_tokens: int) -> None:
        """The request finished after ``output_len`` tokens (of ``max_tokens`` allowed)."""
        if output_len < max_tokens:
            for a in self.allocators.values():
                a.set_output_len(request_id, output_len)

    def step(self) -> None:
        for a in self.allocators.values():
            if a.has_unfinished():
                a.step()

    # ---- our engine's hooks --------------------------------------------------------------
    def on_add(self, engine, group: SequenceGroup) -> None:
        self.add(group.request_id, len(group.prompt_token_ids), group.params.max_tokens,
                 group.params.width)

    def on_abort(self, engine, request_id: str, events) -> None:
        self.abort(engine.request_ids(request_id))     # a v1 parent: each child request

    def on_step(self, engine, record: StepRecord) -> None:
        if record.kind == "reset":       # a prefix-cache reset is not a step
            return
        for rid in record.finished:
            group = engine.groups[rid]
            self.finish(rid, max(len(s.output_token_ids) for s in group.done_seqs),
                        group.params.max_tokens)
        self.step()

    def accounting(self) -> tuple[Accounting, ...]:
        return tuple(baseline_accounting(a.accounting()) for a in self.allocators.values())

    def slabs(self) -> tuple[Slab, ...]:
        return tuple(Slab(policy, *row) for policy, a in self.allocators.items()
                     for row in a.slabs())


def pool_contents(pool: BlockPool) -> PoolContents:
    """Our pool as the snapshot builder's plain values (its own lists, not copies)."""
    return PoolContents(pool.device, pool.block_size, pool.ref_count, pool.block_hash,
                        pool.tokens, pool.free_queue, pool.num_usable, pool.null_block,
                        pool.version)


def seq_states(groups: list[SequenceGroup], done_cache: dict) -> list[SeqState]:
    """Every sequence of ``groups``, by request then seq id. ``done_cache`` (seq_id ->
    SeqState): finished sequences never change again, so each is built once."""
    seqs = []
    for g in groups:
        for s in sorted(g.all_seqs(), key=lambda s: s.seq_id):
            if s.seq_id in done_cache:
                seqs.append(done_cache[s.seq_id])
                continue
            state = SeqState(s.seq_id, s.request_id, s.parent_seq_id, s.born_step,
                             s.status.value, tuple(s.token_ids), s.prompt_len, s.num_computed,
                             tuple(s.block_table),
                             "cpu" if s.block_device == "cpu" else "gpu",  # its table's pool
                             s.output_text, s.cumulative_logprob, s.finish_reason,
                             g.params.use_beam_search)
            if s.is_finished:
                done_cache[s.seq_id] = state
            seqs.append(state)
    return seqs


def build_snapshot(*, step: int, kind: str, groups: list[SequenceGroup], bm: KVCacheBase,
                   queues: tuple[int, int, int], events: tuple[Event, ...], step_time_s: float,
                   model: str, backend: str, device: str, bytes_per_block: int,
                   running_seqs: int, finished: int, baselines: tuple[Accounting, ...],
                   detailed: bool = True, done_cache: dict | None = None,
                   block_cache: dict | None = None, index: int = 0,
                   slabs: tuple = (), semantics: str = "v0",
                   num_preemptions: int = 0) -> StepSnapshot:
    """Our engine's state read into plain values for the snapshot builder
    (engine/observe/snapshot.py). ``detailed=False`` leaves out sequences and blocks."""
    cache = bm.prefix_cache_stats()
    cpu = bm.pools.get("cpu")
    return step_snapshot(
        step=step, kind=kind, index=index, model=model, backend=backend, device=device,
        semantics=semantics,
        sequences=tuple(seq_states(groups, {} if done_cache is None else done_cache))
        if detailed else (),
        gpu=pool_contents(bm.gpu), cpu=pool_contents(cpu) if cpu is not None else None,
        queues=queues, logical_blocks=sum(len(s.block_table) for g in groups for s in g.seqs),
        bytes_per_block=bytes_per_block,
        prefix_cache=PrefixCacheCounts(cache.queries, cache.hits, cache.preempted_queries,
                                       cache.preempted_hits),
        num_preemptions=num_preemptions, running_seqs=running_seqs, finished=finished,
        baselines=baselines, slabs=slabs, events=events, step_time_s=step_time_s,
        detailed=detailed, block_cache={} if block_cache is None else block_cache)


class SnapshotRecorder(SnapshotHistory, Observer):
    """Builds the StepSnapshot after every change and keeps the history the page scrubs.

    Each snapshot gets ``index``, its position among all snapshots this engine recorded (an
    abort records one between two steps, with the step number of the step before it), so the
    history is keyed by position, never by step number."""

    def __init__(self, engine, baselines: ContiguousBaselines | None, max_history: int,
                 detailed: bool = True):
        super().__init__(max_history)
        self.baselines = baselines
        self.detailed = detailed
        self._done_states: dict = {}       # caches: finished sequences never change again,
        self._block_states: dict = {}      # unchanged blocks (see BlockPool.version)
        self.record(engine, "init", (), 0.0)

    def on_add(self, engine, group: SequenceGroup) -> None:
        self.renew_init(lambda: self.record(engine, "init", (), 0.0))

    def on_abort(self, engine, request_id: str, events) -> None:
        self.record(engine, "abort", events, 0.0)

    def on_step(self, engine, record: StepRecord) -> None:
        self.record(engine, record.kind, record.events, record.step_time_s)

    def record(self, engine, kind: str, events: tuple, step_time: float) -> StepSnapshot:
        s = engine.scheduler
        return self.keep(build_snapshot(
            step=engine.step_no, kind=kind, groups=list(engine.groups.values()), bm=engine.bm,
            queues=_queue_lengths(s), events=events,
            step_time_s=step_time, model=engine.config.model, backend=engine.backend_label,
            device=engine.device, bytes_per_block=engine.runner.bytes_per_block,
            running_seqs=s.num_running_seqs(), finished=engine.num_finished,
            baselines=self.baselines.accounting() if self.baselines else (),
            detailed=self.detailed, done_cache=self._done_states,
            block_cache=self._block_states, index=self.recorded,
            slabs=self.baselines.slabs() if self.baselines else (),
            semantics=engine.config.semantics, num_preemptions=s.num_preemptions))

    def accounting_frame(self):
        return accounting_frame(self.accounting_log)
