"""Things that only watch the engine: the contiguous baselines and the snapshot history.

The engine calls every observer after each change it makes -- a request added, a request
aborted, a step done -- and never reads anything back except the snapshot the recorder made.
``EngineConfig(observe=False)`` (and ``Engine.generate``) runs with no observers at all, so
plain generation pays nothing for snapshots, history or baselines.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from engine.observe.accounting import Slab, accounting_frame, baseline_accounting
from engine.observe.baselines import POLICIES, ContiguousAllocator
from engine.events import Event
from engine.core.sequence import SequenceGroup
from engine.observe.snapshot import StepSnapshot, build_snapshot


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
    length it really had, as the Oracle allocator would have known."""

    def __init__(self, capacity_slots: int, max_model_len: int):
        self.allocators = {p: ContiguousAllocator(p, capacity_slots, max_model_len)
                           for p in POLICIES}

    def on_add(self, engine, group: SequenceGroup) -> None:
        for a in self.allocators.values():
            a.add(group.request_id, len(group.prompt_token_ids), group.params.max_tokens,
                  group.params.width)

    def on_abort(self, engine, request_id: str, events) -> None:
        for rid in engine.request_ids(request_id):     # a v1 parent: each child request
            for a in self.allocators.values():
                a.abort(rid)

    def on_step(self, engine, record: StepRecord) -> None:
        if record.kind == "reset":       # a prefix-cache reset is not a step
            return
        for rid in record.finished:
            group = engine.groups[rid]
            out_len = max(len(s.output_token_ids) for s in group.done_seqs)
            if out_len < group.params.max_tokens:
                for a in self.allocators.values():
                    a.set_output_len(rid, out_len)
        for a in self.allocators.values():
            if a.has_unfinished():
                a.step()

    def accounting(self) -> tuple:
        return tuple(baseline_accounting(a.accounting()) for a in self.allocators.values())

    def slabs(self) -> tuple[Slab, ...]:
        return tuple(Slab(policy, *row) for policy, a in self.allocators.items()
                     for row in a.slabs())


class SnapshotRecorder(Observer):
    """Builds the StepSnapshot after every change and keeps the history the page scrubs.

    Each snapshot gets ``index``, its position among all snapshots this engine recorded (an
    abort records one between two steps, with the step number of the step before it), so the
    history is keyed by position, never by step number."""

    def __init__(self, engine, baselines: ContiguousBaselines | None, max_history: int,
                 detailed: bool = True):
        self.baselines = baselines
        self.detailed = detailed
        self.history: deque[StepSnapshot] = deque(maxlen=max_history)
        # every step's accounting (small; kept beyond max_history) and event totals
        self.accounting_log: list[tuple[int, tuple]] = []
        self.event_counts: Counter[str] = Counter()
        self.recorded = 0
        self._done_states: dict = {}       # caches: finished sequences never change again,
        self._block_states: dict = {}      # unchanged blocks (see BlockPool.version)
        self.record(engine, "init", (), 0.0)

    def on_add(self, engine, group: SequenceGroup) -> None:
        """Before the first step, the init snapshot shows the requests queued so far (step 0
        then says what is waiting, not an empty engine)."""
        if self.recorded == 1 and self.history and self.history[-1].kind == "init":
            self.history.pop()
            self.recorded = 0
            self.record(engine, "init", (), 0.0)

    def on_abort(self, engine, request_id: str, events) -> None:
        self.record(engine, "abort", events, 0.0)

    def on_step(self, engine, record: StepRecord) -> None:
        self.record(engine, record.kind, record.events, record.step_time_s)

    def record(self, engine, kind: str, events: tuple, step_time: float) -> StepSnapshot:
        s = engine.scheduler
        snap = build_snapshot(
            step=engine.step_no, kind=kind, groups=list(engine.groups.values()), bm=engine.bm,
            queues=_queue_lengths(s), events=events,
            step_time_s=step_time, model=engine.config.model, backend=engine.backend_label,
            device=engine.device, bytes_per_block=engine.runner.bytes_per_block,
            running_seqs=s.num_running_seqs(), finished=engine.num_finished,
            baselines=self.baselines.accounting() if self.baselines else (),
            detailed=self.detailed, done_cache=self._done_states,
            block_cache=self._block_states, index=self.recorded,
            slabs=self.baselines.slabs() if self.baselines else (),
            semantics=engine.config.semantics, num_preemptions=s.num_preemptions)
        self.recorded += 1
        if kind not in ("init", "abort", "reset"):
            self.accounting_log.append((snap.step, snap.accounting))
        self.event_counts.update(e.kind for e in events)
        self.history.append(snap)
        return snap

    def accounting_frame(self):
        return accounting_frame(self.accounting_log)
