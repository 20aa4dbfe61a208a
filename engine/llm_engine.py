"""The engine: add requests, step one scheduler iteration at a time, observe every change."""
from __future__ import annotations

import itertools
from collections import Counter
import time
from collections import deque
from dataclasses import dataclass

import torch

from engine import events as ev
from engine.beam_search import beam_score, is_done, num_candidates, select_candidates
from engine.accounting import accounting_frame, baseline_accounting
from engine.baselines import POLICIES, ContiguousAllocator
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.invariants import check_invariants
from engine.model_runner import ModelRunner
from engine.length_only import SyntheticRunner
from engine.models.loader import load_model
from engine.models.spec import ModelSpec
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampler import BeamAsk, TokenAsk, sample_step
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Sequence, SequenceGroup, SeqStatus
from engine.snapshot import StepSnapshot, build_snapshot
from kernels import get_ops, resolve_backend

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class StepResult:
    step: int
    kind: str
    events: tuple[ev.Event, ...]
    snapshot: StepSnapshot
    finished: tuple[str, ...]        # request ids that finished in this step


class Engine:
    def __init__(self, config: EngineConfig | None = None):
        config = config or EngineConfig()
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ValueError("device='cuda' was requested but CUDA is not available")
            index = int(device.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA "
                                 "device(s) here")
        dtype_name = config.dtype
        if dtype_name == "auto":
            dtype_name = "bfloat16" if device.startswith("cuda") else "float32"
        self.dtype = _DTYPES[dtype_name]
        backend = resolve_backend(config.backend, device)
        loaded = load_model(config.model, device, self.dtype)
        runner = ModelRunner(loaded, config.num_gpu_blocks, config.num_cpu_blocks,
                             config.block_size, device, self.dtype,
                             get_ops(backend, fallback=config.kernel_fallback))
        self._setup(config, loaded.spec, loaded.tokenizer, runner, device, backend, loaded.path)

    @classmethod
    def length_only(cls, config: EngineConfig | None = None, *, max_model_len: int = 2048,
                    vocab_size: int = 64, detailed_snapshots: bool = False) -> "Engine":
        """The same block manager and scheduler driven without a model (random logits): for
        large simulations where only lengths matter. Prompts are lists of token ids."""
        config = config or EngineConfig()
        eng = cls.__new__(cls)
        eng.config = config
        eng.dtype = torch.float32
        spec = ModelSpec.synthetic(vocab_size, max_model_len)
        eng._setup(config, spec, None, SyntheticRunner(vocab_size, config.seed), "cpu", "none",
                   "(length-only)", detailed_snapshots)
        return eng

    def _setup(self, config: EngineConfig, spec: ModelSpec, tokenizer, runner, device: str,
               backend: str, model_path: str, detailed_snapshots: bool = True) -> None:
        self.config = config
        self.device = device
        self.backend = backend
        self.spec = spec
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.runner = runner
        # where sampling runs: the device the logits come out on (per-request generators too)
        self.sampling_device = device if isinstance(runner, ModelRunner) else "cpu"
        self._eos_ids = () if spec.eos_token_id is None else (spec.eos_token_id,)
        self.detailed_snapshots = detailed_snapshots
        self._events: list[ev.Event] = []
        self.bm = BlockManager(config.num_gpu_blocks, config.num_cpu_blocks, config.block_size,
                               config.enable_prefix_caching, self._events.append)
        self.scheduler = Scheduler(self.bm, config.preemption_mode, config.max_num_seqs,
                                   config.max_num_batched_tokens, self._events.append)
        # the contiguous baselines see the same request stream, in lockstep with the engine
        self.baselines = {p: ContiguousAllocator(p, config.num_gpu_blocks * config.block_size,
                                                 spec.max_model_len) for p in POLICIES}
        self.groups: dict[str, SequenceGroup] = {}
        self.num_finished = 0
        self.step_no = 0
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()
        self.history: deque[StepSnapshot] = deque(maxlen=config.max_history)
        # every step's accounting (small; kept beyond max_history) and event totals
        self.accounting_log: list[tuple[int, tuple]] = []
        self.event_counts: Counter[str] = Counter()
        self._done_states: dict = {}       # snapshot caches: finished sequences, unchanged
        self._block_states: dict = {}      # blocks (see BlockPool.version)
        self.history.append(self._snapshot("init", (), 0.0))

    # ---- requests ------------------------------------------------------------------------
    @property
    def backend_label(self) -> str:
        """Device and the kernels that really ran, e.g. ``cuda-triton``, or after a Triton op
        failed, ``cuda-torch (triton failed: paged_decode_attention: ...)``."""
        ops = getattr(self.runner, "ops", None)
        label = ops.label if ops is not None else self.backend
        return f"{'cuda' if self.device.startswith('cuda') else 'cpu'}-{label}"

    @property
    def max_model_len(self) -> int:
        return self.spec.max_model_len

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: give the prompt as a list of token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            if self.spec.bos_token_id is not None and getattr(self.tokenizer, "add_bos_token", False):
                ids = [self.spec.bos_token_id] + ids
            if not ids:
                raise ValueError("the prompt is empty after tokenization")
            return ids
        if isinstance(prompt, (list, tuple)):
            if not prompt:
                raise ValueError("the prompt is empty")
            bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool)
                   or not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {self.spec.vocab_size}); "
                                 f"got {bad[:5]}")
            return list(prompt)
        raise ValueError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")

    def blocks_needed_worst_case(self, prompt_len: int, params: SamplingParams) -> int:
        """Blocks one request can hold at its longest: the prompt's full blocks shared, every
        live sequence owning the rest of its blocks."""
        bs = self.config.block_size
        shared = prompt_len // bs
        per_seq = -(-(prompt_len + params.max_tokens) // bs) - shared
        return shared + params.width * per_seq

    def check_request(self, prompt: str | list[int], params: SamplingParams | None
                      ) -> tuple[list[int], SamplingParams]:
        """Validate a request without touching any state; returns (token ids, params)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        ids = self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(ids)} tokens; the model's context is "
                             f"{self.max_model_len} tokens")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"the model's context of {self.max_model_len} tokens")
        if params.beam_width > 1 and 2 * params.beam_width > self.spec.vocab_size:
            raise ValueError(f"beam_width {params.beam_width} is too large for a vocabulary of "
                             f"{self.spec.vocab_size}")
        need = self.blocks_needed_worst_case(len(ids), params)
        if need > self.config.num_gpu_blocks:
            width = f" x {params.width} sequences" if params.width > 1 else ""
            raise ValueError(
                f"this request can need {need} KV blocks ({len(ids)} prompt + {params.max_tokens} "
                f"new tokens{width}, block_size {self.config.block_size}) but the pool has only "
                f"{self.config.num_gpu_blocks}: it could never run. Raise num_gpu_blocks or lower "
                "max_tokens / n / beam_width.")
        if params.width > self.config.max_num_seqs:
            raise ValueError(f"n/beam_width {params.width} exceeds max_num_seqs "
                             f"{self.config.max_num_seqs}")
        return ids, params

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; raises ValueError (engine unchanged) if it can never run."""
        ids, params = self.check_request(prompt, params)
        if request_id is None:
            request_id = str(len(self.groups))
            while request_id in self.groups:
                request_id += "'"
        elif request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else self.config.seed * 1_000_003 + len(self.groups)
        gen = torch.Generator(device=self.sampling_device).manual_seed(seed)
        group = SequenceGroup(request_id, prompt if isinstance(prompt, str) else None, ids, params,
                              next(self._arrivals), gen)
        group.seqs.append(Sequence(next(self._seq_ids), request_id, list(ids), len(ids),
                                   born_step=self.step_no))
        self.groups[request_id] = group
        self.scheduler.add(group)
        for baseline in self.baselines.values():
            baseline.add(request_id, len(ids), params.max_tokens, params.width)
        return request_id

    def abort_request(self, request_id: str) -> None:
        group = self.groups.get(request_id)
        if group is None:
            raise ValueError(f"unknown request id {request_id!r}")
        for s in list(group.seqs):
            self._finish(group, s, "abort")
        self.scheduler.remove(group)
        for baseline in self.baselines.values():
            baseline.abort(request_id)
        self.history.append(self._snapshot("abort", tuple(self._take_events()), 0.0))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> StepResult:
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        finished: list[str] = []
        if batch.kind != "idle":
            logits = self.runner.execute(batch)
            for s in batch.seqs:
                s.num_computed = s.num_tokens
            self._process(batch, logits, finished)
            for rid in finished:
                group = self.groups[rid]
                self.scheduler.remove(group)
                out_len = max(len(s.output_token_ids) for s in group.done_seqs)
                if out_len < group.params.max_tokens:
                    for baseline in self.baselines.values():
                        baseline.set_output_len(rid, out_len)
            self.num_finished += len(finished)
        for baseline in self.baselines.values():
            if baseline.has_unfinished():
                baseline.step()
        self.step_no += 1
        events = tuple(self._take_events())
        snap = self._snapshot(batch.kind, events, time.perf_counter() - t0)
        self.history.append(snap)
        return StepResult(self.step_no, batch.kind, events, snap, tuple(finished))

    def _take_events(self) -> list[ev.Event]:
        out = list(self._events)
        self._events.clear()
        return out

    def _process(self, batch: ScheduledBatch, logits: torch.Tensor, finished: list[str]) -> None:
        # every group's ask is answered on the logits' device in one go (engine/sampler.py):
        # only the chosen ids and their logprobs reach the host
        rows = {s.seq_id: i for i, s in enumerate(batch.seqs)}
        eos = self._eos_ids
        work = []
        for g in batch.groups:
            live = [s for s in g.seqs if s.seq_id in rows]
            if not live:
                continue
            p = g.params
            if p.use_beam_search:
                asks = [BeamAsk([rows[s.seq_id] for s in live], [s.cumulative_logprob for s in live],
                                num_candidates(p.beam_width, 0 if p.ignore_eos else len(eos)))]
            elif p.n > 1 and not g.forked:
                asks = [TokenAsk(rows[live[0].seq_id], p.n, p, g.generator)]
            else:
                asks = [TokenAsk(rows[s.seq_id], 1, p, g.generator) for s in live]
            work.append((g, live, asks))
        answers = iter(sample_step(logits, [a for _, _, asks in work for a in asks]))
        for g, live, asks in work:
            got = [next(answers) for _ in asks]
            if g.params.use_beam_search:
                self._beam_step(g, live, got[0])
            elif g.params.n > 1 and not g.forked:
                parent, picks = live[0], got[0]
                children = [parent] + [self._fork(g, parent) for _ in picks[1:]]
                g.forked = True
                for child, (tok, lp) in zip(children, picks):
                    self._append(g, child, tok, lp)
            else:
                for s, picks in zip(live, got):
                    self._append(g, s, *picks[0])
            if g.is_finished:
                finished.append(g.request_id)

    def _fork(self, g: SequenceGroup, parent: Sequence) -> Sequence:
        child = Sequence(next(self._seq_ids), g.request_id, list(parent.token_ids),
                         parent.prompt_len, parent_seq_id=parent.seq_id, born_step=self.step_no + 1,
                         status=parent.status, cumulative_logprob=parent.cumulative_logprob)
        self.bm.fork(parent, child)
        g.seqs.append(child)
        return child

    def _append(self, g: SequenceGroup, s: Sequence, token: int, logprob: float) -> None:
        s.token_ids.append(token)
        s.cumulative_logprob += logprob
        self._events.append(ev.Sample(s.seq_id, token, logprob))
        self._detokenize(s)
        p = g.params
        if len(s.output_token_ids) >= p.max_tokens:
            self._finish(g, s, "length")
        elif not p.ignore_eos and token in self._eos_ids:
            self._finish(g, s, "stop")
        elif p.stop:
            hit = [s.output_text.index(x) for x in p.stop if x in s.output_text]
            if hit:
                s.output_text = s.output_text[:min(hit)]
                self._finish(g, s, "stop")

    def decode_tokens(self, token_ids) -> list[str]:
        """The text of each token on its own (for showing block boundaries in text)."""
        if self.tokenizer is None:
            return [f"<{t}>" for t in token_ids]
        return [self.tokenizer.decode([t]) for t in token_ids]

    def _detokenize(self, s: Sequence) -> None:
        if self.tokenizer is not None:
            s.output_text = self.tokenizer.decode(s.output_token_ids, skip_special_tokens=True)

    def _finish(self, g: SequenceGroup, s: Sequence, reason: str, status=SeqStatus.FINISHED) -> None:
        self.bm.free(s)
        s.status = status
        s.finish_reason = reason
        g.seqs.remove(s)
        g.done_seqs.append(s)
        self._events.append((ev.BeamPrune if status == SeqStatus.PRUNED else ev.Finish)(s.seq_id, reason))

    def _beam_step(self, g: SequenceGroup, live: list[Sequence],
                   ranked: list[tuple[int, int, float]]) -> None:
        p = g.params
        running, new_finished = select_candidates(ranked, p.beam_width,
                                                  () if p.ignore_eos else self._eos_ids)
        out_len = len(live[0].output_token_ids) + 1
        for c in new_finished:           # an EOS hypothesis: kept as data, it needs no blocks
            parent = live[c.parent]
            hyp = Sequence(next(self._seq_ids), g.request_id, parent.token_ids + [c.token_id],
                           parent.prompt_len, parent_seq_id=parent.seq_id,
                           born_step=self.step_no + 1, status=SeqStatus.FINISHED,
                           cumulative_logprob=c.cum_logprob, finish_reason="stop")
            self._detokenize(hyp)
            g.done_seqs.append(hyp)
            self._events.append(ev.Finish(hyp.seq_id, "stop"))
        # survivors: a parent's first child continues in the parent's own sequence; further
        # children fork from it (sharing all its blocks); parents with no child are pruned
        by_parent: dict[int, list] = {}
        for c in running:
            by_parent.setdefault(c.parent, []).append(c)
        updates = []
        for idx, cands in by_parent.items():
            parent = live[idx]
            updates += [(self._fork(g, parent), c, parent.cumulative_logprob) for c in cands[1:]]
            updates.append((parent, cands[0], parent.cumulative_logprob))
        for idx, s in enumerate(live):
            if idx not in by_parent:
                self._finish(g, s, "pruned", SeqStatus.PRUNED)
        for s, c, parent_cum in updates:
            s.token_ids.append(c.token_id)
            s.cumulative_logprob = c.cum_logprob
            self._events.append(ev.Sample(s.seq_id, c.token_id, c.cum_logprob - parent_cum))
            self._detokenize(s)
        hyp_scores = [beam_score(h.cumulative_logprob, len(h.output_token_ids), p.length_penalty)
                      for h in g.done_seqs if h.status == SeqStatus.FINISHED]
        best_running = max((s.cumulative_logprob for s in g.seqs), default=None)
        if (out_len >= p.max_tokens or best_running is None
                or is_done(hyp_scores, best_running, out_len, p.beam_width, p.length_penalty)):
            for s in list(g.seqs):
                self._finish(g, s, "length" if out_len >= p.max_tokens else "beam_done")

    # ---- outputs -------------------------------------------------------------------------
    def get_output(self, request_id: str) -> RequestOutput:
        g = self.groups[request_id]
        p = g.params
        if p.use_beam_search:
            hyps = [s for s in g.done_seqs if s.status == SeqStatus.FINISHED] + g.seqs
            hyps.sort(key=lambda s: -beam_score(s.cumulative_logprob, len(s.output_token_ids),
                                               p.length_penalty))
            chosen = hyps[:p.beam_width]
        else:
            chosen = sorted((s for s in g.all_seqs() if s.status != SeqStatus.PRUNED),
                            key=lambda s: s.seq_id)
        outs = [CompletionOutput(i, s.output_text, list(s.output_token_ids), s.cumulative_logprob,
                                 s.finish_reason, s.seq_id) for i, s in enumerate(chosen)]
        return RequestOutput(g.request_id, g.prompt, list(g.prompt_token_ids), outs, g.is_finished)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run prompts to completion (like vLLM's LLM.generate); outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        for prompt, p in zip(prompts, params_list):   # validate all before queuing any
            self.check_request(prompt, p)
        rids = [self.add_request(pr, p) for pr, p in zip(prompts, params_list)]
        while any(not self.groups[r].is_finished for r in rids):
            result = self.step()
            if result.kind == "idle" and not self.scheduler.running:
                raise RuntimeError("the scheduler cannot make progress (pool too small?)")
        return [self.get_output(r) for r in rids]

    # ---- inspection ----------------------------------------------------------------------
    def _snapshot(self, kind: str, events: tuple, step_time: float) -> StepSnapshot:
        s = self.scheduler
        baselines = tuple(baseline_accounting(b.accounting()) for b in self.baselines.values())
        snap = build_snapshot(self.step_no, kind, list(self.groups.values()), self.bm,
                              (len(s.waiting), len(s.running), len(s.swapped)), events, step_time,
                              self.config.model, self.backend_label, self.device,
                              self.runner.bytes_per_block, s.num_running_seqs(), self.num_finished,
                              baselines, self.detailed_snapshots, self._done_states,
                              self._block_states)
        if kind not in ("init", "abort"):
            self.accounting_log.append((snap.step, snap.accounting))
        self.event_counts.update(e.kind for e in events)
        return snap

    def accounting_frame(self):
        """Per-step accounting of the paged pool and every baseline (a pandas DataFrame)."""
        return accounting_frame(self.accounting_log)

    @property
    def snapshot(self) -> StepSnapshot:
        return self.history[-1]

    def check_invariants(self) -> None:
        check_invariants(self.bm, list(self.groups.values()), self.scheduler)


