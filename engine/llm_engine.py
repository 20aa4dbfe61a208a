"""The engine: add requests, step one scheduler iteration at a time, observe every change.

A step reads top to bottom: schedule -> allocate / copy-on-write (in the scheduler and block
manager) -> run the model -> process outputs -> notify observers. Validation lives in
input_processor.py, sampling results in output_processor.py, and everything that only watches
(snapshots, history, contiguous baselines) in observers.py.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

import torch

import engine.events as ev
from engine.config import EngineConfig
from engine.core.invariants import check_invariants
from engine.core.sequence import Sequence, SequenceGroup
from engine.core.worst_case import blocks_needed_worst_case
from engine.models.runner import ModelRunner
from engine.models.spec import ModelSpec
from engine.models.synthetic import SyntheticRunner
from engine.observe.observers import ContiguousBaselines, SnapshotRecorder, StepRecord
from engine.observe.snapshot import StepSnapshot
from engine.outputs import RequestOutput
from engine.processing.input_processor import InputProcessor, unpack_prompt
from engine.processing.output_processor import OutputProcessor
from engine.processing.parallel_sampling import child_seed
from engine.sampling_params import SamplingParams
from engine.sched.interface import ScheduledBatch
from engine.sched.registry import semantics_of


@dataclass(frozen=True)
class StepResult:
    step: int
    kind: str
    events: tuple[ev.Event, ...]
    snapshot: StepSnapshot | None    # None when the engine runs without observers
    finished: tuple[str, ...]        # request ids that finished in this step
    step_time_s: float = 0.0         # schedule + model + outputs (observers not included)


class Engine:
    def __init__(self, config: EngineConfig | None = None, *, spec: ModelSpec | None = None,
                 runner=None, detailed_snapshots: bool = True):
        """``spec`` + ``runner`` replace the model (Engine.length_only); otherwise the model is
        loaded from ``config.model``."""
        config = config or EngineConfig()
        if runner is None:
            runner = ModelRunner.from_config(config)
            spec, tokenizer, model_path = runner.spec, runner.loaded.tokenizer, runner.loaded.path
        else:
            tokenizer, model_path = None, "(length-only)"
        self.config, self.spec, self.tokenizer, self.model_path = config, spec, tokenizer, model_path
        self.runner, self.device, self.dtype, self.backend = (runner, runner.device, runner.dtype,
                                                              runner.backend)
        self._events: list[ev.Event] = []
        emit = self._events.append
        self.semantics = semantics_of(config.semantics)
        self.bm, self.scheduler = self.semantics.build(config, emit)
        self.inputs = InputProcessor(spec, tokenizer, config, self.semantics)
        self._seq_ids = itertools.count()
        self.outputs = OutputProcessor(self.bm, spec.eos_token_ids, tokenizer,
                                       self._events.append, lambda: next(self._seq_ids),
                                       self.semantics.stop_strings_after_min_tokens)
        self.groups: dict[str, SequenceGroup] = {}
        # v1 parallel sampling: a request with n > 1 runs as n child requests (their ids)
        self.children: dict[str, list[str]] = {}
        self._num_requests = 0
        self.num_finished = 0
        self.step_no = 0
        self._arrivals = itertools.count()
        self.baselines = self.recorder = None
        self.observers = []
        if config.observe:
            # the same usable capacity as the paged pool (v1's null block holds nothing)
            self.baselines = ContiguousBaselines(self.bm.gpu.num_usable * config.block_size,
                                                 self.max_model_len)
            self.recorder = SnapshotRecorder(self, self.baselines, config.max_history,
                                             detailed_snapshots)
            self.observers = [self.baselines, self.recorder]   # baselines first: snapshots read them
        # publishers watch every step, also during generate(): a KV event stream has no gaps
        self.publishers = []
        if config.kv_events_endpoint is not None:
            from engine.kv_events.publisher import KVEventPublisher
            self.publishers.append(KVEventPublisher.from_config(config))

    @classmethod
    def length_only(cls, config: EngineConfig | None = None, *, max_model_len: int = 2048,
                    vocab_size: int = 64, detailed_snapshots: bool = False) -> "Engine":
        """The same block manager and scheduler driven without a model (random logits): for
        large simulations where only lengths matter. Prompts are lists of token ids."""
        config = config or EngineConfig()
        return cls(config, spec=ModelSpec.synthetic(vocab_size, max_model_len),
                   runner=SyntheticRunner(vocab_size, config.seed),
                   detailed_snapshots=detailed_snapshots)

    # ---- requests ------------------------------------------------------------------------
    @property
    def backend_label(self) -> str:
        """Device and the kernels that really ran, e.g. ``cuda-triton``, or after a Triton op
        failed, ``cuda-torch (triton failed: paged_decode_attention: ...)``."""
        label = self.runner.ops.label if self.runner.ops is not None else self.backend
        return f"{'cuda' if self.device.startswith('cuda') else 'cpu'}-{label}"

    @property
    def max_model_len(self) -> int:
        """The longest prompt + output a sequence may reach (EngineConfig.max_model_len, or the
        model's context)."""
        return self.inputs.max_model_len

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        return self.inputs.tokenize(prompt)

    def blocks_needed_worst_case(self, prompt_len: int, params: SamplingParams) -> int:
        # a request stops at max_model_len whatever max_tokens says (input_processor.py)
        room = self.max_model_len - prompt_len
        max_tokens = max(1, room if params.max_tokens is None else min(params.max_tokens, room))
        return blocks_needed_worst_case(prompt_len, max_tokens, params.width,
                                        self.config.block_size)

    def check_request(self, prompt, params: SamplingParams | None):
        """Validate a request without touching any state; returns (token ids, params)."""
        return self.inputs.check(prompt, params)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, cache_salt: str | None = None) -> str:
        """Queue a request; raises ValueError (engine unchanged) if it can never run.

        ``cache_salt`` (vLLM's name): only requests with the same salt share prefix-cache
        blocks. In v1 a request with n > 1 becomes n child requests with ids ``"{i}_{id}"``,
        child i seeded with seed + i if the request has a seed (vLLM v1
        engine/parallel_sampling.py), else with its own default seed; the id returned is
        the parent's, and ``get_output`` gathers the children's outputs. A prompt may also be
        one of vLLM's prompt dicts, ``{"prompt": text}`` or ``{"prompt_token_ids": ids}``, with
        an optional ``"cache_salt"``."""
        prompt, cache_salt = unpack_prompt(prompt, cache_salt)
        ids, params = self.check_request(prompt, params)
        if request_id is None:
            request_id = str(len(self.groups) + len(self.children))
            while self._id_taken(request_id, params):
                request_id += "'"
        elif self._id_taken(request_id, params):
            raise ValueError(f"request id {request_id!r} is already in use")
        # the default seed counts requests (a v1 parent once, not per child), as v0 does
        seed = (params.seed if params.seed is not None
                else self.config.seed * 1_000_003 + self._num_requests)
        self._num_requests += 1
        children = self.semantics.child_request_ids(request_id, params)
        if children:
            self.children[request_id] = children
            for i, child in enumerate(children):
                cseed = child_seed(seed, i, params.seed is not None)
                self._add_group(child, prompt, ids, dataclasses.replace(params, n=1, seed=cseed),
                                cseed, cache_salt)
        else:
            self._add_group(request_id, prompt, ids, params, seed, cache_salt)
        return request_id

    def _id_taken(self, request_id: str, params: SamplingParams) -> bool:
        """The id, or (v1, n > 1) any of its child ids, already names a request or a parent."""
        ids = [request_id, *self.semantics.child_request_ids(request_id, params)]
        return any(r in self.groups or r in self.children for r in ids)

    def _add_group(self, request_id: str, prompt, ids: list[int], params: SamplingParams,
                   seed: int, cache_salt: str | None) -> None:
        # on the device the logits come out on: sampling runs there (engine/processing/sampler.py)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        group = SequenceGroup(request_id, prompt if isinstance(prompt, str) else None, ids, params,
                              next(self._arrivals), gen, cache_salt=cache_salt)
        group.seqs.append(Sequence(next(self._seq_ids), request_id, list(ids), len(ids),
                                   born_step=self.step_no, cache_salt=cache_salt))
        self.groups[request_id] = group
        self.scheduler.add(group)
        for o in self.observers:
            o.on_add(self, group)

    def request_ids(self, request_id: str) -> list[str]:
        """The engine requests behind a request id: itself, or its v1 child requests."""
        if request_id in self.children:
            return self.children[request_id]
        if request_id in self.groups:
            return [request_id]
        raise ValueError(f"unknown request id {request_id!r}")

    def is_finished(self, request_id: str) -> bool:
        return all(self.groups[r].is_finished for r in self.request_ids(request_id))

    def abort_request(self, request_id) -> None:
        """End a request (or each of an iterable of ids, as vLLM's ``abort_request``) with
        finish_reason "abort", freeing its blocks; every id is checked before any is ended."""
        if not isinstance(request_id, str):
            if not isinstance(request_id, (list, tuple, set, frozenset)):
                raise ValueError(f"request_id must be an id or a list of ids, got "
                                 f"{type(request_id).__name__}")
            ids = list(dict.fromkeys(request_id))
            for rid in ids:
                if not isinstance(rid, str):
                    raise ValueError(f"a request id is a string, got {rid!r}")
                self.request_ids(rid)
            for rid in ids:
                self.abort_request(rid)
            return
        rids = self.request_ids(request_id)
        if self.is_finished(request_id):
            return                       # nothing to end: no abort event, no snapshot
        for rid in rids:
            group = self.groups[rid]
            for s in list(group.seqs):
                self.outputs.finish(group, s, "abort")
            self.scheduler.remove(group)
        events = self._take_events()
        for o in (*self.observers, *self.publishers):
            o.on_abort(self, request_id, events)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop every prefix-cache entry (vLLM's ``LLM.reset_prefix_cache``): only when no block
        is in use; returns whether it was done. Observers see a "reset" record.

        ``reset_running_requests=True`` (vLLM v1 only, as in vLLM's ``Scheduler.
        reset_prefix_cache``): every running request is preempted by recompute first, so the
        reset can be done mid-run; the requests resume with the same outputs."""
        if not isinstance(reset_running_requests, bool):
            raise ValueError(f"reset_running_requests must be True or False, got "
                             f"{reset_running_requests!r}")
        if reset_running_requests and self.semantics.reset_running_refusal:
            raise ValueError(self.semantics.reset_running_refusal)
        if reset_running_requests:
            self.scheduler.preempt_all_running()
        if not self.bm.reset_prefix_cache():
            # v1's waiting requests hold no blocks, so after the preemptions none is in use
            # (vLLM raises here too)
            if reset_running_requests:
                raise RuntimeError("reset_prefix_cache: blocks still in use after preempting "
                                   "every running request")
            return False
        record = StepRecord(self.step_no, "reset", self._take_events(), (), 0.0)
        for o in (*self.observers, *self.publishers):
            o.on_step(self, record)
        return True

    def close(self) -> None:
        """Stop the KV event publisher (its sockets and thread); the engine stays usable."""
        for p in self.publishers:
            p.close()
        self.publishers = []

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_num_unfinished_requests(self) -> int:
        """Requests not finished yet (vLLM's LLMEngine name); under v1 each child request of
        an n > 1 request counts, as vLLM v1's output processor tracks them one by one."""
        return sum(1 for g in self.groups.values() if not g.is_finished)

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> StepResult:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        finished: list[str] = []
        if batch.kind == "idle" and (batch.swap_out or batch.swap_in or batch.copies):
            # nothing to compute, KV to move: v0 swapped a group out before its decode
            self.runner.move_kv(batch)
        if batch.kind != "idle":
            logits = self.runner.execute(batch)
            for r in batch.scheduled:
                r.seq.num_computed = r.end
            sampling = batch
            # only requests whose last known token was computed sample (a v1 prompt chunk
            # that is not the last one throws its logits away)
            rows = [i for i, r in enumerate(batch.scheduled)
                    if r.seq.num_computed == r.seq.num_tokens]
            if len(rows) < len(batch.scheduled):
                sampling = ScheduledBatch(batch.kind, [batch.scheduled[i] for i in rows])
                logits = logits[rows]
            if sampling.seqs:
                finished = self.outputs.process(sampling, logits, self.step_no)
            for rid in finished:
                self.scheduler.remove(self.groups[rid])
            self.num_finished += len(finished)
        self.step_no += 1
        record = StepRecord(self.step_no, batch.kind, self._take_events(), tuple(finished),
                            time.perf_counter() - t0)
        for o in (*self.observers, *self.publishers):
            o.on_step(self, record)
        return StepResult(self.step_no, batch.kind, record.events, self.snapshot, record.finished,
                          record.step_time_s)

    def _take_events(self) -> tuple[ev.Event, ...]:
        out = tuple(self._events)
        self._events.clear()
        return out

    # ---- outputs -------------------------------------------------------------------------
    def get_output(self, request_id: str) -> RequestOutput:
        rids = self.request_ids(request_id)
        if rids == [request_id]:
            return self.outputs.request_output(self.groups[request_id])
        # v1 parallel sampling: the children's completions, child i as output i
        outs = [self.outputs.request_output(self.groups[r]) for r in rids]
        completions = [dataclasses.replace(o.outputs[0], index=i) for i, o in enumerate(outs)]
        first = outs[0]
        finished = all(o.finished for o in outs)
        # vLLM builds the parent's output from the child whose finish completes it
        # (ParentRequest.get_outputs, then that child's make_request_output), so its
        # num_cached_tokens is that child's; children finishing in one step finish in the
        # order they were scheduled, the last one completing the parent
        last = (max(rids, key=lambda r: self.groups[r].finish_order) if finished else rids[0])
        return RequestOutput(request_id, first.prompt, first.prompt_token_ids, completions,
                             finished, self.groups[last].num_cached_tokens)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 *, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run prompts to completion (like vLLM's LLM.generate, whose keyword
        ``sampling_params`` is accepted too); outputs in prompt order. A prompt is text, token
        ids or one of vLLM's prompt dicts (see ``add_request``).

        Plain generation: no snapshots, history or baselines are made while it runs (the
        observers are paused), so it pays nothing for them."""
        if sampling_params is not None:
            if params is not None:
                raise ValueError("give the SamplingParams once: params or sampling_params")
            params = sampling_params
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        for prompt, p in zip(prompts, params_list):   # validate all before queuing any
            self.check_request(unpack_prompt(prompt)[0], p)
        observers, self.observers = self.observers, []
        try:
            rids = [self.add_request(pr, p) for pr, p in zip(prompts, params_list)]
            while any(not self.is_finished(r) for r in rids):
                result = self.step()
                # an idle step that preempted (v0's worst-case decode rule) makes progress
                # through the recompute that follows; one with nothing running and no
                # preemption cannot
                if result.kind == "idle" and not self.scheduler.running and not any(
                        e.kind == "preempt" for e in result.events):
                    raise RuntimeError("the scheduler cannot make progress (pool too small?)")
        finally:
            self.observers = observers
        return [self.get_output(r) for r in rids]

    def decode_tokens(self, token_ids) -> list[str]:
        """The text of each token on its own (for showing block boundaries in text)."""
        if self.tokenizer is None:
            return [f"<{t}>" for t in token_ids]
        return [self.tokenizer.decode([t]) for t in token_ids]

    # ---- inspection (observers) ----------------------------------------------------------
    @property
    def history(self):
        """Snapshots kept for stepping back (empty without observers)."""
        return self.recorder.history if self.recorder else ()

    @property
    def snapshot(self) -> StepSnapshot | None:
        return self.recorder.history[-1] if self.recorder else None

    @property
    def accounting_log(self) -> list:
        return self.recorder.accounting_log if self.recorder else []

    @property
    def event_counts(self):
        return self.recorder.event_counts if self.recorder else {}

    def accounting_frame(self):
        """Per-step accounting of the paged pool and every baseline (a pandas DataFrame)."""
        if self.recorder is None:
            raise ValueError("this engine runs without observers (EngineConfig(observe=False))")
        return self.recorder.accounting_frame()

    def check_invariants(self) -> None:
        check_invariants(self.bm, list(self.groups.values()), self.scheduler)
