"""The scheduler tap (real_vllm/tap/scheduler.py) inside a real vLLM (0.32, CPU build, the
default model), in-process: ``EngineArgs(scheduler_cls="real_vllm.tap.scheduler.TapScheduler")``
with VLLM_ENABLE_V1_MULTIPROCESSING=0 and a ZeroMQ SUB on 127.0.0.1 in the test.

After each phase (schedule, update) the test reads the same scheduler the way
real_vllm/adapter.py does (queues, computed tokens, ``req_to_blocks``, every block's ref count
and hash, free blocks, preemptions as ``_preempt_request`` is called) and requires the frame of
that phase, applied to the state rebuilt from the frames before it, to say the same; and the
invariants to hold on every rebuilt state."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from real_vllm.tap.frames import Frame, Hello, TapOff, decode
from tests.vllm_real.serve import MODEL, free_port
from tests.vllm_real.workloads import toks

QUALNAME = "real_vllm.tap.scheduler.TapScheduler"


@contextmanager
def env(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Rebuilt:
    """The scheduler's state as a subscriber rebuilds it from keyframes and deltas (the test's
    own minimal follower)."""

    def __init__(self):
        self.hello: Hello | None = None
        self.requests: dict = {}
        self.blocks: dict[int, tuple[int, int | None]] = {}

    def apply(self, f: Frame) -> None:
        if f.keyframe:
            self.requests, self.blocks = {}, {}
        for rid in f.gone:
            self.requests.pop(rid, None)
        for r in f.requests:
            self.requests[r.request_id] = r
        for b in f.blocks:
            if b.ref_cnt == 0 and b.block_hash is None:
                self.blocks.pop(b.block_id, None)
            else:
                self.blocks[b.block_id] = (b.ref_cnt, b.block_hash)


def check_invariants(state: Rebuilt, f: Frame) -> None:
    h = state.hello
    held: dict[int, int] = {}
    for r in state.requests.values():
        if r.status == "preempted":
            assert r.block_ids == [[]] * len(r.block_ids), f"{r.request_id} preempted, holds"
        for table in r.block_ids:
            for b in table:
                if b != h.null_block:
                    held[b] = held.get(b, 0) + 1
    refs = {b: ref for b, (ref, _) in state.blocks.items() if ref}
    assert refs == held, f"step {f.step} {f.phase}: ref counts != tables holding the block"
    assert f.num_free_blocks == h.num_blocks - 1 - len(held), "free != pool - null - held"
    assert set(f.running) | set(f.waiting) == set(state.requests)
    assert not set(f.running) & set(f.waiting)


def truth(sched, scheduled, preempted, phase) -> dict:
    """The scheduler read directly, as real_vllm/adapter.py reads it."""
    from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash
    kv = sched.kv_cache_manager
    managers = kv.coordinator.single_type_managers
    pool = kv.block_pool
    return dict(
        phase=phase, scheduled=dict(scheduled), preempted=list(preempted),
        running=[r.request_id for r in sched.running],
        waiting=[r.request_id for r in sched.kv_holding_waiting]
        + [r.request_id for r in sched.waiting],
        computed={rid: r.num_computed_tokens for rid, r in sched.requests.items()},
        tables={rid: [[b.block_id for b in m.req_to_blocks.get(rid, ())] for m in managers]
                for rid in sched.requests},
        blocks={b.block_id: (b.ref_cnt, None if b.block_hash is None
                             else maybe_convert_block_hash(get_block_hash(b.block_hash)))
                for b in pool.blocks
                if b.block_id != pool.null_block.block_id and (b.ref_cnt or b.block_hash)},
        free=pool.get_num_free_blocks())


def run_tapped(script, *, num_blocks: int, keyframe_s: float, max_model_len: int = 320,
               fail_at: int | None = None):
    """Runs ``script`` (("add", id, prompt, max_tokens) / ("step", n) / ("run",) / ("abort",
    id) / ("reset",)) in an in-process vLLM with the tap; returns (truths, messages, outputs)."""
    import zmq
    from vllm import EngineArgs, LLMEngine, SamplingParams
    port = free_port()
    extra = {"PAGED_LAB_TAP_FAIL_AT_STEP": fail_at} if fail_at is not None else {}
    with env(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
             PAGED_LAB_TAP_ENDPOINT=f"tcp://127.0.0.1:{port}",
             PAGED_LAB_TAP_KEYFRAME_S=keyframe_s, **extra):
        llm = LLMEngine.from_engine_args(EngineArgs(
            model=MODEL, block_size=32, num_gpu_blocks_override=num_blocks,
            max_model_len=max_model_len, max_num_seqs=8, max_num_batched_tokens=512,
            dtype="float32", enforce_eager=True, seed=0, scheduler_cls=QUALNAME))
    sub = zmq.Context.instance().socket(zmq.SUB)
    try:
        sched = llm.engine_core.engine_core.scheduler
        truths, preempted = [], []
        schedule, update, preempt = (sched.schedule, sched.update_from_output,
                                     sched._preempt_request)

        def caught_schedule(*a, **k):
            out = schedule(*a, **k)          # the tap's frame is built inside, then we read
            truths.append(truth(sched, out.num_scheduled_tokens, preempted, "schedule"))
            preempted.clear()
            return out

        def caught_update(so, mro):
            out = update(so, mro)
            truths.append(truth(sched, {}, preempted, "update"))
            preempted.clear()
            return out

        def caught_preempt(request, *a, **k):
            preempted.append(request.request_id)
            return preempt(request, *a, **k)

        sched.schedule, sched.update_from_output = caught_schedule, caught_update
        sched._preempt_request = caught_preempt
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.subscribe(b"tap")
        time.sleep(0.3)                      # the subscription reaches the tap first
        messages, ids = [], {}
        params = lambda n: SamplingParams(max_tokens=n, ignore_eos=True, temperature=0)

        def drain():
            while sub.poll(0):
                topic, seq, payload = sub.recv_multipart()
                messages.append((int.from_bytes(seq, "big"), decode(payload)))

        outputs: dict[str, list[int]] = {}

        def step():
            for ro in llm.step():
                outputs[ro.request_id] = list(ro.outputs[0].token_ids)
            drain()

        for call in script:
            if call[0] == "add":
                ids[call[1]] = llm.add_request(call[1], {"prompt_token_ids": call[2]},
                                               params(call[3]))
            elif call[0] == "step":
                for _ in range(call[1]):
                    step()
            elif call[0] == "abort":
                llm.abort_request([call[1]])
            elif call[0] == "reset":
                assert llm.reset_prefix_cache()
            else:
                while llm.has_unfinished_requests():
                    step()
        deadline = time.monotonic() + 5
        while len(messages) < 2 * len(truths) and time.monotonic() < deadline:
            sub.poll(50)
            drain()
        time.sleep(0.2)
        drain()
        return truths, messages, outputs, ids
    finally:
        sub.close(0)
        llm.engine_core.shutdown()


def compare(truths, messages) -> tuple[int, int]:
    """Every frame against the direct read of its phase; returns (keyframes, deltas)."""
    seqs = [s for s, _ in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the sequence"
    frames = [m for _, m in messages if isinstance(m, Frame)]
    assert not [m for _, m in messages if isinstance(m, TapOff)]
    assert frames and frames[0].keyframe, "the first frame a subscriber gets is a keyframe"
    assert len(frames) == len(truths), (len(frames), len(truths))
    state = Rebuilt()
    keyframes = 0
    it = iter(truths)
    for _, m in messages:
        if isinstance(m, Hello):
            state.hello = m
            continue
        t = next(it)
        state.apply(m)
        where = f"step {m.step} {m.phase}"
        keyframes += m.keyframe
        assert m.phase == t["phase"], where
        assert m.scheduled == t["scheduled"], where
        assert m.preempted == t["preempted"], where
        assert (m.running, m.waiting) == (t["running"], t["waiting"]), where
        assert m.num_free_blocks == t["free"], where
        assert {r: s.num_computed_tokens for r, s in state.requests.items()} == t["computed"], \
            where
        assert {r: s.block_ids for r, s in state.requests.items()} == t["tables"], where
        assert state.blocks == t["blocks"], where
        assert m.dropped == 0
        check_invariants(state, m)
    return keyframes, len(truths) - keyframes


def test_tap_frames_equal_the_scheduler_with_preemption(vllm_ready):
    """A pool too small for six requests: vLLM preempts (in an order the frames must keep),
    one request is aborted between steps; keyframe only first (all later frames are deltas)."""
    prompts = [toks(100 + 37 * i, 60) for i in range(6)]
    script = [("add", f"r{i}", p, 100) for i, p in enumerate(prompts)]
    script += [("step", 25), ("abort", "r1"), ("run",)]
    truths, messages, _, _ = run_tapped(script, num_blocks=12, keyframe_s=1000)
    keyframes, deltas = compare(truths, messages)
    assert keyframes == 1 and deltas > 100
    preempted = [r for t in truths for r in t["preempted"]]
    assert len(preempted) >= 2, "the workload was meant to preempt"
    hello = next(m for _, m in messages if isinstance(m, Hello))
    assert (hello.num_blocks, hello.null_block, hello.block_size, hello.max_model_len,
            hello.kv_cache_groups, hello.async_scheduling, hello.prefix_caching) == \
        (12, 0, 32, 320, ["FullAttentionSpec"], False, True)
    assert hello.vllm_version.startswith("0.32")


def test_tap_frames_equal_the_scheduler_with_shared_prefixes(vllm_ready):
    """Requests sharing a 64-token prefix (two full blocks, ref counts > 1, cached hashes),
    later ones hitting the cache, then a prefix-cache reset (a keyframe must follow);
    keyframes every 50 ms between deltas."""
    prefix = toks(700, 64)
    first = [prefix + toks(900 + 50 * i, 10 + 7 * i) for i in range(4)]
    later = [prefix + toks(1500 + 50 * i, 5 + 3 * i) for i in range(3)]
    script = [("add", f"a{i}", p, 30) for i, p in enumerate(first)] + [("step", 8)]
    script += [("add", f"b{i}", p, 20) for i, p in enumerate(later)] + [("run",), ("reset",)]
    script += [("add", "c0", prefix + toks(2000, 9), 5), ("run",)]
    truths, messages, _, _ = run_tapped(script, num_blocks=40, keyframe_s=0.05)
    keyframes, deltas = compare(truths, messages)
    assert keyframes >= 2 and deltas >= 10, (keyframes, deltas)
    shared = [b for t in truths for b, (ref, _) in t["blocks"].items() if ref > 1]
    assert shared, "the prefix was meant to be shared"


def test_tap_error_turns_it_off_and_vllm_serves_on(vllm_ready):
    """An error injected inside the tap (PAGED_LAB_TAP_FAIL_AT_STEP) at step 3: a TapOff
    arrives, no frame after it, and every request finishes with its full output."""
    prompts = [toks(300 + 11 * i, 40) for i in range(3)]
    script = [("add", f"e{i}", p, 12) for i, p in enumerate(prompts)] + [("run",)]
    _, messages, outputs, ids = run_tapped(script, num_blocks=40, keyframe_s=1000, fail_at=3)
    kinds = [type(m).__name__ for _, m in messages]
    assert kinds[-1] == "TapOff" and kinds.count("TapOff") == 1, kinds
    assert "PAGED_LAB_TAP_FAIL_AT_STEP" in messages[-1][1].reason
    assert max(m.step for _, m in messages if isinstance(m, Frame)) == 2
    assert sorted(outputs) == sorted(ids) and all(len(t) == 12 for t in outputs.values())


def test_tap_off_when_internals_are_missing(vllm_ready, caplog):
    """Pinned to vLLM 0.32: a scheduler without the names the tap reads gets one log line and
    no tap (nothing raised)."""
    from real_vllm.tap.scheduler import Tap

    class NotVllm0_32:
        requests, running, waiting = {}, [], []

    tap = Tap(NotVllm0_32())
    assert tap.on is False


def test_qualname_picks_the_async_variant(vllm_ready):
    """``TapScheduler`` (what --scheduler-cls names) becomes ``AsyncTapScheduler`` (over vLLM's
    AsyncScheduler) when async scheduling is on -- a GPU's default; the CPU build forces it
    off, so only the choice and the method order are checked here, not a run."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from real_vllm.tap.scheduler import AsyncTapScheduler, TapScheduler, _TapMixin

    def config(async_scheduling):
        return SimpleNamespace(scheduler_config=SimpleNamespace(
            async_scheduling=async_scheduling))
    assert type(TapScheduler.__new__(TapScheduler, vllm_config=config(True))) \
        is AsyncTapScheduler
    assert type(TapScheduler.__new__(TapScheduler, vllm_config=config(False))) is TapScheduler
    assert type(TapScheduler.__new__(TapScheduler, config(None))) is TapScheduler
    mro = AsyncTapScheduler.__mro__
    assert mro.index(_TapMixin) < mro.index(AsyncScheduler) < mro.index(Scheduler)
    assert issubclass(AsyncTapScheduler, TapScheduler)   # so Python runs __init__ on it
    # the overlap lives in AsyncScheduler's overrides; the variant keeps them
    assert AsyncTapScheduler._update_after_schedule is AsyncScheduler._update_after_schedule
