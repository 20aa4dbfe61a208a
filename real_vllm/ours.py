"""Our engine's state after a step, as the ``StepView`` real vLLM's adapter reads.

An observer (it only watches): attach it, step the engine, ``drain()`` takes the KV event batches
the step published, and ``view(result)`` gives the step's view (reading only, as the adapter's
``view()`` does: two views of one step are equal). KV events go through ``KVEventRecorder``, the very batching our publisher sends, encoded
with ts = 0 as ``state.py`` says.
"""
from __future__ import annotations

import msgspec

from engine.kv_events.publisher import KVEventRecorder
from engine.kv_events.wire import KVEventBatch
from real_vllm.state import StepView

_ENCODER = msgspec.msgpack.Encoder()


def encode_events(events: list) -> bytes:
    return _ENCODER.encode(KVEventBatch(0.0, events, None))


class OurStepViewer:
    """Reads ``engine`` (semantics "v1") into StepViews."""

    def __init__(self, engine):
        self.engine = engine
        self.recorder = KVEventRecorder(engine.config.block_size)
        engine.observers.append(self.recorder)
        self._seen_batches = 0
        self._batches: list = []             # the batches the last drain() took

    def detach(self) -> None:
        if self.recorder in self.engine.observers:
            self.engine.observers.remove(self.recorder)

    def _request_of(self) -> dict[int, str]:
        return {s.seq_id: g.request_id for g in self.engine.groups.values() for s in g.all_seqs()}

    def drain(self) -> list:
        """Take the KV event batches published since the last drain, for the next views."""
        self._batches = self.recorder.batches[self._seen_batches:]
        self._seen_batches = len(self.recorder.batches)
        return self._batches

    def view(self, result=None) -> StepView:
        """The state now; with ``result`` (the StepResult of the step just taken), also what
        that step scheduled, preempted, sampled and finished."""
        eng = self.engine
        rid = self._request_of()
        scheduled: dict[str, int] = {}
        preempted, new_tokens, finished = [], {}, {}
        for e in (result.events if result is not None else ()):
            if e.kind == "prefill":
                scheduled[rid[e.seq_id]] = scheduled.get(rid[e.seq_id], 0) + e.end - e.start
            elif e.kind == "append":
                scheduled[rid[e.seq_id]] = scheduled.get(rid[e.seq_id], 0) + 1
            elif e.kind == "preempt":
                preempted.append(rid[e.seq_id])
            elif e.kind == "sample":
                new_tokens.setdefault(rid[e.seq_id], []).append(e.token_id)
            elif e.kind == "finish":
                finished[rid[e.seq_id]] = e.reason
        queues = eng.scheduler.queues()
        live = [g for g in eng.groups.values() if not g.is_finished]
        pool = eng.bm.gpu
        return StepView(
            step=eng.step_no, scheduled=scheduled, preempted=preempted,
            running=[g.request_id for g in queues["running"]],
            waiting=[g.request_id for g in queues["waiting"]],
            num_computed={g.request_id: g.seqs[0].num_computed for g in live},
            block_tables={g.request_id: list(g.seqs[0].block_table) for g in live
                          if g.seqs[0].block_table},
            ref_counts=list(pool.ref_count),
            block_hashes={b: h for b, h in enumerate(pool.block_hash) if h},
            free_queue=list(pool.free_queue),
            kv_events=[encode_events(events) for _, events in self._batches],
            new_tokens=new_tokens, finished=finished)
