"""``--scheduler-cls real_vllm.tap.scheduler.TapScheduler``: vLLM's own scheduler, publishing
each phase's state over ZeroMQ (frames.py), without a patch to vLLM (pinned to vLLM 0.32).

vLLM resolves the qualname in the engine-core process (one per data-parallel rank) and calls
it with keyword arguments (``EngineCore.__init__``, v1/engine/core.py). It must *be* vLLM's
scheduler, not wrap it: EngineCore reads ``connector``, ``kv_cache_manager`` … on it. So the
tap logic is a mixin over vLLM's two schedulers, and ``TapScheduler.__new__`` returns the
``AsyncScheduler`` variant when ``scheduler_config.async_scheduling`` is on (a ``Scheduler``
under async scheduling would lose the overlap). ``AsyncTapScheduler`` subclasses
``TapScheduler``, so Python still runs ``__init__`` on what ``__new__`` returned.

The tap never raises into vLLM: every read is inside ``_guard``; the first error is logged,
a ``TapOff`` is sent, and the tap is off for good while vLLM keeps serving. What it reads
(vLLM 0.32): ``requests`` / ``running`` / ``waiting`` / ``kv_holding_waiting``; per request
``num_computed_tokens`` …; ``kv_cache_manager.coordinator.single_type_managers[g]
.req_to_blocks``; ``block_pool.blocks[i].ref_cnt`` / ``_block_hash``; ``_preempt_request``
(the order of preemptions) and ``_free_request_blocks`` (which blocks a free touches).

Deltas stay cheap for big pools: a block's state can only change when a request's table grows
(the tail from the previous frame's last block), when a request's blocks are freed (hooked),
or on a prefix-cache reset (a keyframe follows). Only those blocks are read and compared with
what was last published; a full scan runs only for keyframes (``PAGED_LAB_TAP_KEYFRAME_S``).
"""
from __future__ import annotations

import os
import time

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from real_vllm.tap.frames import (DEFAULT_ENDPOINT, DEFAULT_TOPIC, ENDPOINT_ENV, TOPIC_ENV,
                                  BlockState, Frame, Hello, RequestState, TapOff)
from real_vllm.tap.publisher import TapPublisher

logger = init_logger("vllm.paged_lab_tap")      # under "vllm": printed by vLLM's handlers

KEYFRAME_ENV = "PAGED_LAB_TAP_KEYFRAME_S"
FAIL_AT_STEP_ENV = "PAGED_LAB_TAP_FAIL_AT_STEP"   # tests: an error inside the tap at step N
OFF_ENV = "PAGED_LAB_TAP_OFF"                     # "1": vLLM's scheduler only (benchmarks)
SENDER_ENV = "PAGED_LAB_TAP_SENDER"               # "direct": no sender thread (publisher.py)
_MASK64 = (1 << 64) - 1

# What the tap reads, checked at start (vLLM 0.32 names); a miss turns the tap off.
SCHEDULER_NAMES = ("requests", "running", "waiting", "kv_cache_manager", "kv_cache_config",
                   "scheduler_config", "cache_config", "parallel_config", "block_size",
                   "max_model_len", "_preempt_request", "_free_request_blocks", "_free_blocks",
                   "add_request", "schedule", "update_from_output")
POOL_NAMES = ("blocks", "null_block", "num_gpu_blocks", "get_num_free_blocks")
BLOCK_NAMES = ("block_id", "ref_cnt", "_block_hash")
REQUEST_NAMES = ("num_output_tokens", "num_tokens")   # properties of vllm.v1.request.Request


_STATUS: dict = {}                                # RequestStatus -> the wire's word


def _status(request) -> str:
    s = _STATUS.get(request.status)
    if s is None:                                 # an Enum's .name is slow: once per status
        name = request.status.name
        s = _STATUS[request.status] = ("running" if name == "RUNNING" else
                                       "preempted" if name == "PREEMPTED" else "waiting")
    return s


def _int_hash(h) -> int | None:
    """vLLM's 64-bit form of a block hash (its KV events' default): the digest's low 64 bits
    (the key is digest + 4-byte group id)."""
    return None if h is None else int.from_bytes(h[-12:-4], "big") & _MASK64


def _bytes_hash(h) -> bytes | None:
    return None if h is None else bytes(h[:-4])


def _hash_form():
    """The form vLLM's KV events use (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), so the tap's
    hashes and the server's KV events name a block alike."""
    import vllm.envs as envs
    return _int_hash if envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES else _bytes_hash


class Tap:
    """The state the tap keeps between frames, and the frames it builds."""

    def __init__(self, sched):
        self.sched = sched
        self.on = False
        missing = [f"Scheduler.{n}" for n in SCHEDULER_NAMES if not hasattr(sched, n)]
        kv = getattr(sched, "kv_cache_manager", None)
        pool = getattr(kv, "block_pool", None)
        managers = getattr(getattr(kv, "coordinator", None), "single_type_managers", None)
        if pool is None:
            missing.append("kv_cache_manager.block_pool")
        else:
            missing += [f"BlockPool.{n}" for n in POOL_NAMES if not hasattr(pool, n)]
            if getattr(pool, "blocks", None):
                missing += [f"KVCacheBlock.{n}" for n in BLOCK_NAMES
                            if not hasattr(pool.blocks[0], n)]
        if not managers or not all(hasattr(m, "req_to_blocks") for m in managers):
            missing.append("kv_cache_manager.coordinator.single_type_managers[*].req_to_blocks")
        from vllm.v1.request import Request
        missing += [f"Request.{n}" for n in REQUEST_NAMES if not hasattr(Request, n)]
        import vllm
        self.version = getattr(vllm, "__version__", "?")
        if missing:
            logger.warning("paged-lab tap off: vLLM %s lacks %s (the tap reads vLLM 0.32's "
                           "scheduler)", self.version, ", ".join(missing))
            return
        self.pool, self.blocks = pool, pool.blocks
        self.null = pool.null_block.block_id
        self.tables = [m.req_to_blocks for m in managers]
        groups = sched.kv_cache_config.kv_cache_groups
        self.group_kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        # full-attention tables only grow while held: their block ids can be reused
        self.append_only = [k == "FullAttentionSpec" for k in self.group_kinds]
        self.single = self.append_only == [True]
        self.rank = getattr(sched.parallel_config, "data_parallel_index",
                            sched.parallel_config.data_parallel_rank)
        self.keyframe_s = float(os.environ.get(KEYFRAME_ENV, "1.0"))
        self.hash_of = _hash_form()
        fail = os.environ.get(FAIL_AT_STEP_ENV, "")
        self.fail_at = int(fail) if fail.strip() else None
        self.step = -1                      # schedule() calls so far, minus one
        self.steps_of: dict[int, int] = {}  # id(SchedulerOutput) -> its step, until updated
        self.preempted: list[str] = []      # this phase's preemptions, in order
        self.touched: set[int] = set()      # blocks a free touched since the last frame
        # under sync scheduling update_from_output changes blocks only by freeing (hooked);
        # AsyncScheduler caches the tails' hashes there too
        self.tails_in_update = bool(sched.scheduler_config.async_scheduling)
        self.tail_pad = 2 if self.tails_in_update else 1
        self.new: list[str] = []            # requests added since the last frame
        self.left: list[str] = []           # requests vLLM let go since the last frame
        self.ids: dict[str, list] = {}      # request -> per group block ids last published
        self.state: dict[int, tuple] = {}   # block -> (ref_cnt, key) last published, non-idle
        self.last_keyframe = float("-inf")
        self.force_keyframe = True
        self.frames_sent = 0
        self.tap_s = 0.0                    # time spent in the tap (the benchmark reads it)
        self.sizes = {"keyframe": [0, 0, 0], "delta": [0, 0, 0]}   # frames, bytes, largest
        endpoint = os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
        topic = os.environ.get(TOPIC_ENV, DEFAULT_TOPIC)
        try:
            self.pub = TapPublisher(endpoint, topic, self.rank,
                                    sender_thread=os.environ.get(SENDER_ENV) != "direct")
        except ValueError as e:
            logger.warning("paged-lab tap off: %s", e)
            return
        self.on = True
        logger.info("paged-lab tap: rank %d publishing on %s topic %r (keyframe every %.1f s)",
                    self.rank, self.pub.endpoint, topic, self.keyframe_s)

    # ---- hooks (vLLM's thread) ---------------------------------------------------------
    def fail(self, e: BaseException) -> None:
        self.on = False
        logger.exception("paged-lab tap off after an error (vLLM serves on): %r", e)
        try:
            self.pub.publish(TapOff(reason=f"{type(e).__name__}: {e}"))
            self.pub.close()
        except Exception:                   # noqa: BLE001 - nothing may reach vLLM
            pass

    def freeing(self, request) -> None:
        rid = request.request_id
        for table in self.tables:
            for b in table.get(rid, ()):
                self.touched.add(b.block_id)
        self.ids.pop(rid, None)             # a freed table starts over

    def after_schedule(self, out) -> None:
        t0 = time.perf_counter()
        self.step += 1
        self.steps_of[id(out)] = self.step
        if len(self.steps_of) > 64:         # outputs never updated (an error elsewhere)
            self.steps_of.pop(next(iter(self.steps_of)))
        if self.fail_at is not None and self.step == self.fail_at:
            raise RuntimeError(f"injected by {FAIL_AT_STEP_ENV}={self.fail_at}")
        self.emit("schedule", self.step, out.num_scheduled_tokens)
        self.tap_s += time.perf_counter() - t0

    def after_update(self, scheduler_output) -> None:
        t0 = time.perf_counter()
        step = self.steps_of.pop(id(scheduler_output), self.step)
        self.emit("update", step, scheduler_output.num_scheduled_tokens)
        self.tap_s += time.perf_counter() - t0

    # ---- frames ------------------------------------------------------------------------
    def request_state(self, r) -> RequestState:
        rid = r.request_id
        last = self.ids.get(rid)
        if self.single:                     # one full-attention group: the common case
            blocks = self.tables[0].get(rid) or ()
            old = last[0] if last is not None else None
            if (old is None or len(old) != len(blocks)
                    or (old and old[-1] != blocks[-1].block_id)):
                last = self.ids[rid] = [[b.block_id for b in blocks]]
        else:
            ids = []
            for g, table in enumerate(self.tables):
                blocks = table.get(rid) or ()
                old = last[g] if last is not None else None
                if (old is not None and self.append_only[g] and len(old) == len(blocks)
                        and (not old or old[-1] == blocks[-1].block_id)):
                    ids.append(old)         # unchanged since the last frame
                else:
                    ids.append([b.block_id for b in blocks])
            last = self.ids[rid] = ids
        return RequestState(rid, _STATUS.get(r.status) or _status(r), r.num_computed_tokens,
                            r.num_prompt_tokens, r.num_output_tokens, r.num_preemptions, last)

    def block_state(self, bid: int) -> BlockState:
        b = self.blocks[bid]
        return BlockState(bid, b.ref_cnt, self.hash_of(b._block_hash))

    def emit(self, phase: str, step: int, scheduled: dict[str, int]) -> None:
        sched, pub = self.sched, self.pub
        if pub.joins():                     # someone joined: give them the whole picture
            self.force_keyframe = True
        now = time.time()
        keyframe = self.force_keyframe or now - self.last_keyframe >= self.keyframe_s
        live = sched.requests
        gone, self.left = self.left, []
        new, self.new = self.new, []
        if keyframe:
            requests = [self.request_state(r) for r in live.values()]
            blocks, state = [], {}
            for b in self.blocks:
                if (b.ref_cnt or b._block_hash is not None) and b.block_id != self.null:
                    state[b.block_id] = (b.ref_cnt, b._block_hash)
                    blocks.append(BlockState(b.block_id, b.ref_cnt, self.hash_of(b._block_hash)))
            self.state = state
            self.touched.clear()
            self.last_keyframe, self.force_keyframe = now, False
        else:
            changed = [rid for rid in scheduled if rid in live]
            changed += [rid for rid in self.preempted if rid in live and rid not in scheduled]
            changed += [rid for rid in new if rid in live]
            touched = self.touched
            tails = scheduled if phase == "schedule" or self.tails_in_update else ()
            for rid in tails:               # a grown table: from the old last block on
                last = self.ids.get(rid)
                for g, table in enumerate(self.tables):
                    blocks = table.get(rid)
                    if not blocks:
                        continue
                    start = len(last[g]) - 1 if last is not None else 0
                    # the blocks this step's tokens filled (hashed); async: one more
                    start = max(0, min(start, len(blocks) - self.tail_pad
                                       - scheduled[rid] // sched.block_size))
                    touched.update([b.block_id for b in blocks[start:]])
            requests, seen = [], set()
            for rid in changed:
                if rid not in seen:
                    seen.add(rid)
                    requests.append(self.request_state(live[rid]))
            blocks = []
            state = self.state
            touched.discard(self.null)
            for bid in touched:
                b = self.blocks[bid]
                now_state = (b.ref_cnt, b._block_hash)
                if state.get(bid, (0, None)) != now_state:
                    if now_state == (0, None):
                        state.pop(bid, None)
                    else:
                        state[bid] = now_state
                    blocks.append(BlockState(bid, b.ref_cnt, self.hash_of(b._block_hash)))
            touched.clear()
        waiting = [r.request_id for r in getattr(sched, "kv_holding_waiting", ())]
        waiting += [r.request_id for r in sched.waiting]
        frame = Frame(step=step, phase=phase, ts=now, keyframe=keyframe,
                      num_free_blocks=self.pool.get_num_free_blocks(),
                      scheduled=dict(scheduled) if phase == "schedule" else {},
                      preempted=self.preempted, finished=gone,
                      running=[r.request_id for r in sched.running], waiting=waiting,
                      requests=requests, gone=[] if keyframe else gone, blocks=blocks,
                      dropped=pub.dropped)
        self.preempted = []
        if keyframe:
            pub.publish(self.hello())
        pub.publish(frame)
        self.frames_sent += 1
        size = self.sizes["keyframe" if keyframe else "delta"]
        size[0] += 1
        size[1] += pub.last_size
        size[2] = max(size[2], pub.last_size)

    def hello(self) -> Hello:
        s = self.sched
        return Hello(vllm_version=self.version, rank=self.rank,
                     num_blocks=self.pool.num_gpu_blocks, null_block=self.null,
                     block_size=s.block_size, max_model_len=s.max_model_len,
                     kv_cache_groups=list(self.group_kinds),
                     async_scheduling=bool(s.scheduler_config.async_scheduling),
                     prefix_caching=bool(s.cache_config.enable_prefix_caching),
                     keyframe_every_s=self.keyframe_s)

    def close(self) -> None:
        self.on = False
        self.pub.close(wait_s=1.0)


class _TapMixin:
    """The hooks: vLLM's method first (its errors are its own), then the tap, guarded."""

    _tap: Tap | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tap = None
        if os.environ.get(OFF_ENV) == "1":
            return
        try:
            tap = Tap(self)
            if tap.on:
                self._tap = tap
        except Exception as e:              # noqa: BLE001 - vLLM must start regardless
            logger.exception("paged-lab tap off: could not start (%r)", e)

    def _guard(self, method, *args) -> None:
        tap = self._tap
        try:
            method(*args)
        except Exception as e:              # noqa: BLE001 - never into vLLM
            self._tap = None
            tap.fail(e)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        if self._tap is not None:
            self._guard(self._tap.after_schedule, out)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        if self._tap is not None:
            self._guard(self._tap.after_update, scheduler_output)
        return out

    def _preempt_request(self, request, *args, **kwargs):
        if self._tap is not None:
            self._tap.preempted.append(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def add_request(self, request, *args, **kwargs):
        out = super().add_request(request, *args, **kwargs)
        if self._tap is not None:
            self._tap.new.append(request.request_id)
        return out

    def _free_blocks(self, request, *args, **kwargs):
        # where vLLM 0.32 deletes a request from ``requests`` (finished or aborted)
        if self._tap is not None:
            self._tap.left.append(request.request_id)
        return super()._free_blocks(request, *args, **kwargs)

    def _free_request_blocks(self, request):
        if self._tap is not None:
            self._guard(self._tap.freeing, request)
        return super()._free_request_blocks(request)

    def _drain_deferred_frees(self):
        # blocks a connector's deferred free returns: mark them all touched (rare)
        if self._tap is not None and getattr(self, "deferred_frees", None):
            self._tap.touched.update(b.block_id for _, bl in self.deferred_frees for b in bl)
        return super()._drain_deferred_frees()

    def reset_prefix_cache(self, *args, **kwargs):
        out = super().reset_prefix_cache(*args, **kwargs)
        if self._tap is not None:
            self._tap.force_keyframe = True   # every hash may have gone: a full scan
        return out

    def shutdown(self) -> None:
        if self._tap is not None:
            self._guard(self._tap.close)
            self._tap = None
        super().shutdown()


class TapScheduler(_TapMixin, Scheduler):
    """The qualname to pass to ``--scheduler-cls``; becomes ``AsyncTapScheduler`` under
    asynchronous scheduling (see the module doc)."""

    def __new__(cls, *args, **kwargs):
        config = kwargs.get("vllm_config", args[0] if args else None)
        if (cls is TapScheduler and config is not None
                and config.scheduler_config.async_scheduling):
            cls = AsyncTapScheduler
        return super().__new__(cls)


class AsyncTapScheduler(TapScheduler, AsyncScheduler):
    """MRO: AsyncTapScheduler, TapScheduler, _TapMixin, AsyncScheduler, Scheduler."""
