"""``RealVllmEngine``: real vLLM's engine stepped one scheduler iteration at a time, its own
objects read into ``StepView``s.

It builds vLLM's ``LLMEngine`` in this process (``environment.py`` sets it up), adds requests
as token ids, and on each ``step()`` reads, from vLLM's own objects (vLLM 0.32,
``vllm/v1/core/sched/scheduler.py``, ``kv_cache_manager.py``, ``block_pool.py``):
- the ``SchedulerOutput`` of the step (``num_scheduled_tokens``), caught as ``schedule``
  returns it, and each preemption as ``_preempt_request`` is called, in order;
- the running and waiting queues, each request's ``num_computed_tokens`` and blocks
  (``coordinator.single_type_managers[0].req_to_blocks``);
- every block's ``ref_cnt`` and ``block_hash``, the free queue in order
  (``FreeKVCacheBlockQueue.get_all_free_blocks``);
- the KV event batch the scheduler publishes (its publisher's ``publish`` is wrapped), and the
  ``EngineCoreOutputs`` of ``update_from_output`` (new tokens, finish and stop reasons).
Nothing is changed in vLLM: the wrappers call the original and keep what it returned. Request
ids are the caller's: vLLM's random suffix is removed, and an n > 1 request's children are
``"{i}_{id}"`` as vLLM names them (``child_request_ids``, as our engine names its own).
What arrived during a step (outputs, KV event batches, prefix-cache counts) is taken by
``drain()``, which ``step()`` calls; ``view()`` only reads, so it can be called any number of
times.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine.processing.parallel_sampling import child_request_ids
from real_vllm.environment import VllmUnavailable, import_vllm, installed_version
from real_vllm.state import Completion, StepView

CPU_BLOCK_MULTIPLE = 32       # vLLM's CPU attention: "No common block size for 16"


@dataclass(frozen=True)
class VllmSettings:
    """What real vLLM is started with; the names are vLLM's (EngineArgs)."""
    model: str                              # a local model folder
    block_size: int = 32
    num_gpu_blocks: int = 64                # the whole pool, block 0 (the null block) included
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    long_prefill_token_threshold: int = 0
    max_model_len: int = 1024
    enable_prefix_caching: bool = True
    seed: int = 0

    @classmethod
    def from_engine(cls, engine) -> "VllmSettings":
        """The settings of our engine (``Engine``, semantics "v1"), for the same run in vLLM."""
        c = engine.config
        return cls(model=str(engine.model_path), block_size=c.block_size,
                   num_gpu_blocks=c.num_gpu_blocks, max_num_seqs=c.max_num_seqs,
                   max_num_batched_tokens=c.max_num_batched_tokens,
                   long_prefill_token_threshold=c.long_prefill_token_threshold,
                   max_model_len=engine.max_model_len, enable_prefix_caching=c.prefix_caching,
                   seed=c.seed)

    def problems(self, on_cpu: bool = True) -> list[str]:
        """What real vLLM would refuse, in its terms, before anything starts."""
        out = []
        if on_cpu and self.block_size % CPU_BLOCK_MULTIPLE:
            out.append(f"block_size {self.block_size}: vLLM's CPU attention needs a multiple "
                       f"of {CPU_BLOCK_MULTIPLE}")
        usable = (self.num_gpu_blocks - 1) * self.block_size
        if self.max_model_len > usable:
            out.append(f"max_model_len {self.max_model_len}: vLLM refuses to start unless one "
                       f"request of max_model_len tokens fits in the pool "
                       f"({self.num_gpu_blocks - 1} usable blocks x {self.block_size} = "
                       f"{usable} tokens)")
        if self.max_num_batched_tokens < self.max_num_seqs:
            out.append(f"max_num_batched_tokens {self.max_num_batched_tokens} is below "
                       f"max_num_seqs {self.max_num_seqs}, which vLLM refuses")
        return out


def _need(obj, name: str, where: str):
    try:
        return getattr(obj, name)
    except AttributeError:
        raise VllmUnavailable(f"vLLM {installed_version()}: {where}.{name} not found; this "
                              f"adapter reads vLLM 0.32's scheduler and cache manager") from None


def to_vllm_params(params, logprobs: bool = False):
    """Our SamplingParams as vLLM's (the same field names; beam search is not a v1 request).
    ``logprobs``: vLLM also returns each sampled token's logprob (``logprobs=0``: the sampled
    token only), which does not change what is sampled."""
    from vllm import SamplingParams as VllmParams
    if params.use_beam_search:
        raise ValueError("beam search is not a request in vLLM v1's engine (LLM.beam_search "
                         "drives it from outside)")
    return VllmParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                      top_k=params.top_k if params.top_k > 0 else 0,
                      max_tokens=params.max_tokens, min_tokens=params.min_tokens,
                      seed=params.seed, stop=list(params.stop or []) or None,
                      stop_token_ids=list(params.stop_token_ids or []) or None,
                      ignore_eos=params.ignore_eos,
                      include_stop_str_in_output=params.include_stop_str_in_output,
                      logprobs=0 if logprobs else None)


class RealVllmEngine:
    """``logprobs``: ask vLLM for each sampled token's logprob (``Completion.logprobs``)."""

    def __init__(self, settings: VllmSettings, logprobs: bool = False):
        EngineArgs, KVEventsConfig, LLMEngine = import_vllm()
        from vllm.platforms import current_platform
        problems = settings.problems(on_cpu=current_platform.is_cpu())
        if problems:
            raise ValueError("real vLLM cannot run these settings: " + "; ".join(problems))
        self.settings = settings
        self.logprobs = logprobs
        args = EngineArgs(
            model=settings.model, block_size=settings.block_size,
            num_gpu_blocks_override=settings.num_gpu_blocks, max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            long_prefill_token_threshold=settings.long_prefill_token_threshold,
            max_model_len=settings.max_model_len,
            enable_prefix_caching=settings.enable_prefix_caching,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
            dtype="float32", seed=settings.seed, enforce_eager=True,
            # one step's output before the next is scheduled, as ours (a GPU turns it on)
            async_scheduling=False)
        self.llm = LLMEngine.from_engine_args(args)
        core = _need(_need(self.llm, "engine_core", "LLMEngine"), "engine_core",
                     "LLMEngine.engine_core (in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        self.scheduler = sched = _need(core, "scheduler", "EngineCore")
        self.kv = _need(sched, "kv_cache_manager", "Scheduler")
        self.pool = _need(self.kv, "block_pool", "KVCacheManager")
        self._blocks_of = _need(_need(self.kv, "coordinator", "KVCacheManager"),
                                "single_type_managers", "KVCacheCoordinator")[0].req_to_blocks
        for name in ("running", "waiting", "requests"):
            _need(sched, name, "Scheduler")
        _need(self.pool, "free_block_queue", "BlockPool")
        self._ours: dict[str, str] = {}            # vLLM's request id -> the caller's
        self._internal: dict[str, str] = {}        # the caller's request id -> vLLM's
        self._children: dict[str, list[str]] = {}  # caller's parent id -> child ids
        self.completions: dict[str, Completion] = {}
        self.num_cached_tokens: dict[str, int] = {}
        self.step_no = 0
        self._finished_now: dict[str, str] = {}
        # what the last drain() took: the last step's new tokens, finishes and KV batches
        self._new_tokens: dict[str, list[int]] = {}
        self._finished: dict[str, str] = {}
        self._kv_events: list[bytes] = []
        # vLLM's PrefixCacheStats (tokens), summed over the steps' SchedulerStats, which carry
        # each step's counts (KVCacheManager.make_prefix_cache_stats resets them)
        self.prefix_cache = {"queries": 0, "hits": 0, "preempted_queries": 0,
                             "preempted_hits": 0}
        self._catch(sched)

    # ---- what a step did: the original methods, their results kept ----------------------
    def _catch(self, sched) -> None:
        self._scheduled = None
        self.scheduled_requests: dict[str, tuple[list[int], int, int]] = {}
        self._preempted: list[str] = []
        self._batches: list = []
        self._core_outputs: list = []
        schedule = _need(sched, "schedule", "Scheduler")
        update = _need(sched, "update_from_output", "Scheduler")
        preempt = _need(sched, "_preempt_request", "Scheduler")
        publisher = _need(sched, "kv_event_publisher", "Scheduler")

        def caught_schedule(*a, **k):
            self._scheduled = out = schedule(*a, **k)
            # each scheduled request as schedule left it (before the step's outputs can finish
            # and free it): its block table, computed tokens (hits and this step's included)
            # and token count
            self.scheduled_requests = {}
            for rid in out.num_scheduled_tokens:
                r = sched.requests.get(rid)
                if r is not None:
                    self.scheduled_requests[self._ours.get(rid, rid)] = (
                        [b.block_id for b in self._blocks_of.get(rid, ())],
                        r.num_computed_tokens, r.num_tokens)
            return out

        def caught_update(*a, **k):
            out = update(*a, **k)
            self._core_outputs.append(out)
            return out

        def caught_preempt(request, *a, **k):
            self._preempted.append(request.request_id)
            return preempt(request, *a, **k)

        sched.schedule, sched.update_from_output = caught_schedule, caught_update
        sched._preempt_request = caught_preempt
        publisher.publish = self._batches.append

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params,
                    cache_salt: str | None = None) -> None:
        prompt = {"prompt_token_ids": list(prompt_token_ids)}
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        internal = self.llm.add_request(request_id, prompt, to_vllm_params(params, self.logprobs))
        self._ours[internal] = request_id
        self._internal[request_id] = internal
        kids = child_request_ids(request_id, params.n)
        if kids:
            self._children[request_id] = kids
            for kid, internal_kid in zip(kids, child_request_ids(internal, params.n)):
                self._ours[internal_kid] = kid
                self._internal[kid] = internal_kid

    def request(self, request_id: str):
        """vLLM's ``Request`` for the caller's id (a child's id for an n > 1 request's child),
        None once vLLM has let it go (finished or aborted) or before it was added."""
        internal = self._internal.get(request_id)
        return self.scheduler.requests.get(internal) if internal is not None else None

    def abort_request(self, request_id: str) -> None:
        self.llm.abort_request([request_id])
        self._preempted.clear()

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        done = self.llm.reset_prefix_cache(reset_running_requests)
        self._preempted.clear()           # preemptions of a reset are not a step's
        return done

    def has_unfinished_requests(self) -> bool:
        return self.llm.has_unfinished_requests()

    def close(self) -> None:
        self.llm.engine_core.shutdown()

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> StepView:
        self._scheduled = None
        self.scheduled_requests = {}
        self._preempted.clear()
        self._finished_now = {}
        # outputs as the caller sees them: the frontend's RequestOutputs (stop strings are
        # found there, after the engine core's step, which then aborts the request)
        for ro in self.llm.step():
            for c in ro.outputs:
                rid = (self._children[ro.request_id][c.index]
                       if ro.request_id in self._children else ro.request_id)
                self.num_cached_tokens[rid] = ro.num_cached_tokens
                if ro.finished:
                    self.num_cached_tokens[ro.request_id] = ro.num_cached_tokens
                known = self.completions.get(rid)
                if c.finish_reason is not None and (known is None or known.finish_reason is None):
                    self._finished_now[rid] = str(c.finish_reason)
                logprobs = ([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]
                            if c.logprobs else [])
                self.completions[rid] = Completion(list(c.token_ids), c.finish_reason,
                                                   c.stop_reason, c.text, logprobs)
        self.step_no += 1
        self.drain()
        return self.view()

    def drain(self) -> tuple[dict[str, list[int]], dict[str, str], list[bytes]]:
        """Take what arrived since the last drain: the engine core's outputs (new tokens; the
        prefix-cache counts, added to ``prefix_cache``), the requests finished and the KV
        event batches published. Kept for ``view()`` until the next drain, and returned as
        (new tokens, finished, KV event payloads)."""
        ours = self._ours.get
        new_tokens: dict[str, list[int]] = {}
        for outs in self._core_outputs:
            for eco in outs.values():
                stats = eco.scheduler_stats
                pc = stats.prefix_cache_stats if stats is not None else None
                if pc is not None:
                    for k in self.prefix_cache:
                        self.prefix_cache[k] += getattr(pc, k)
                for o in eco.outputs:
                    if o.new_token_ids:
                        new_tokens.setdefault(ours(o.request_id, o.request_id), []).extend(
                            o.new_token_ids)
        self._core_outputs.clear()
        finished, self._finished_now = self._finished_now, {}
        batches = [msgspec.msgpack.encode(type(b)(ts=0.0, events=b.events,
                                                  data_parallel_rank=b.data_parallel_rank))
                   for b in self._batches]
        self._batches.clear()
        self._new_tokens, self._finished, self._kv_events = new_tokens, finished, batches
        return new_tokens, finished, batches

    def view(self) -> StepView:
        """vLLM's state now, with what the last step scheduled and preempted and what the last
        ``drain()`` took. Reads only: calling it twice gives the same view."""
        ours = self._ours.get
        sched, pool = self.scheduler, self.pool
        scheduled = ({ours(r, r): n for r, n in self._scheduled.num_scheduled_tokens.items()}
                     if self._scheduled is not None else {})
        live = list(sched.requests.values())
        tables = {}
        for r in live:
            blocks = self._blocks_of.get(r.request_id)
            if blocks:
                tables[ours(r.request_id, r.request_id)] = [b.block_id for b in blocks]
        return StepView(
            step=self.step_no, scheduled=scheduled,
            preempted=[ours(r, r) for r in self._preempted],
            running=[ours(r.request_id, r.request_id) for r in sched.running],
            waiting=[ours(r.request_id, r.request_id) for r in sched.waiting],
            num_computed={ours(r.request_id, r.request_id): r.num_computed_tokens for r in live},
            block_tables=tables,
            ref_counts=[b.ref_cnt for b in pool.blocks],
            block_hashes={b.block_id: bytes(b.block_hash[:-4]).hex() for b in pool.blocks
                          if b.block_hash is not None},
            free_queue=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            kv_events=list(self._kv_events),
            new_tokens={rid: list(t) for rid, t in self._new_tokens.items()},
            finished=dict(self._finished))
