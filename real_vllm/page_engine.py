"""The page's engine when "Real vLLM" is chosen: real vLLM stepped one scheduler iteration at a
time in this process, every figure drawn from its own state, and our v1 engine on the same
requests in lockstep (the Compare view's agreement line).

``VllmPageEngine`` is a ``PageEngine`` (app/page_engine.py: what the page's lab and views call
on an engine): requests in, ``step``, ``history`` of snapshots, the tokenizer, and what it
offers beyond our engine (its start-up time, its prefix cache from its KV events, our engine
beside it in ``lockstep``). The snapshots are real vLLM's
(real_vllm/snapshots.py); our engine only tokenizes (the same tokenizer files vLLM loads) and
runs beside it, its steps compared by ``Lockstep``. Sampled requests get explicit seeds (the
settings' seed + the request's index) so both engines draw the same tokens.

vLLM keeps process-wide state (its current config, the forward context), so every call into
it holds ``VLLM_LOCK``: two sessions' real-vLLM engines step one after the other (each step
takes milliseconds on the embedded model).
"""
from __future__ import annotations

import dataclasses
import threading
import time

from real_vllm.adapter import VllmSettings
from real_vllm.lockstep import Lockstep, LockstepStep
from real_vllm.snapshots import VllmSnapshots

VLLM_LOCK = threading.RLock()


def page_settings_problems(engine, params_list) -> list[str]:
    """What real vLLM (0.32, this machine) would refuse or crash on, in the page's terms,
    before anything starts. ``engine``: our v1 engine with the settings; ``params_list``: the
    requests' SamplingParams."""
    from vllm.platforms import current_platform           # imported by import_vllm first
    on_cpu = current_platform.is_cpu()
    problems = VllmSettings.from_engine(engine).problems(on_cpu=on_cpu)
    sampled = [p for p in params_list if p.temperature > 0]
    seqs = sum(p.n for p in params_list)
    budget, mml = engine.config.max_num_batched_tokens, engine.max_model_len
    if on_cpu and sampled and budget < seqs * mml:
        problems.append(
            f"temperature > 0 with a token budget per step of {budget}: vLLM 0.32's CPU build "
            "crashes on a seeded request whose prompt is computed in chunks (its sampler's "
            "generator cannot rewind on a CPU), and the page seeds sampled requests so that "
            f"ours and vLLM draw the same tokens. Set temperature 0, or raise the token budget "
            f"to {seqs * mml} ({seqs} sequences x max_model_len {mml}) so no prompt is chunked")
    return problems


_warmed: set[int] = set()                   # vocabulary sizes compiled in this process


def warm_up_sampler(vocab_size: int) -> float:
    """Compile vLLM's logprob rank count now, not on the first Step. vLLM 0.32's sampler runs
    ``batched_count_greater_than`` (vllm/v1/sample/ops/logprobs.py, ``torch.compile``) inside
    ``Sampler.gather_logprobs`` on the first step that returns logprobs: that first Step took
    7.5 s against 0.02 s for the next ones here (issue 38: the page sat greyed at step 0 for
    17 s). The call is vLLM's own static method on throwaway tensors of the model's
    vocabulary: no request, block or random state is touched. Seconds spent (0 if done)."""
    if vocab_size in _warmed:
        return 0.0
    import torch
    from vllm.v1.sample.sampler import Sampler
    t0 = time.perf_counter()
    logprobs = torch.zeros(2, vocab_size).log_softmax(dim=-1, dtype=torch.float32)
    Sampler.gather_logprobs(logprobs, 1, torch.zeros(2, dtype=torch.int64))
    _warmed.add(vocab_size)
    return time.perf_counter() - t0


class VllmPageEngine:
    is_real_vllm = True

    def __init__(self, ours, *, seed: int = 0):
        t0 = time.perf_counter()
        with VLLM_LOCK:
            self.lockstep = Lockstep.start(ours, logprobs=True)
            self.observer = VllmSnapshots(self.lockstep.vllm, model=ours.config.model,
                                          max_model_len=ours.max_model_len,
                                          max_history=ours.config.max_history)
        self.lockstep.step_vllm = self.observer.step
        self.ours = ours
        self.seed = seed
        with VLLM_LOCK:
            self.warm_up_s = warm_up_sampler(self.lockstep.vllm.llm.model_config.get_vocab_size())
        self.startup_s = time.perf_counter() - t0
        self.step_times: list[float] = []      # wall time of each lockstep step, vLLM's alone
        self._requests = 0                     # in snapshot.step_time_s
        self.closed = False

    # ---- what the page reads -------------------------------------------------------------
    @property
    def config(self):
        return self.ours.config

    @property
    def semantics(self):
        return self.ours.semantics             # the rules both follow

    @property
    def step_no(self) -> int:
        return self.lockstep.vllm.step_no

    @property
    def tokenizer(self):
        return self.ours.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.ours.max_model_len

    @property
    def version(self) -> str:
        return self.observer.backend

    def tokenize(self, prompt) -> list[int]:
        return self.ours.tokenize(prompt)

    def decode_tokens(self, token_ids) -> list[str]:
        return self.ours.decode_tokens(token_ids)

    @property
    def history(self):
        return self.observer.history

    @property
    def snapshot(self):
        return self.observer.snapshot

    @property
    def event_counts(self):
        return self.observer.event_counts

    @property
    def num_finished(self) -> int:
        return self.observer.num_finished

    @property
    def cache_view(self):
        return self.observer.cache_view

    @property
    def steps(self) -> list[LockstepStep]:
        return self.lockstep.steps

    def summary(self) -> str:
        return self.lockstep.summary()

    # ---- requests and steps --------------------------------------------------------------
    def check_request(self, prompt, params):
        return self.ours.check_request(prompt, params)

    def add_request(self, prompt, params) -> str:
        """Queue ``prompt`` in both engines (ValueError, nothing queued, if ours refuses it);
        a sampled request is seeded (settings' seed + its index) unless it has a seed."""
        ids, params = self.ours.check_request(prompt, params)
        if params.temperature > 0 and params.seed is None:
            params = dataclasses.replace(params, seed=self.seed + self._requests)
        rid = str(self._requests)
        with VLLM_LOCK:
            self.lockstep.add_request(rid, ids, params)
            self.observer.on_add(rid, ids, params)
        self._requests += 1
        return rid

    def has_unfinished_requests(self) -> bool:
        return self.lockstep.has_unfinished_requests()

    def step(self) -> LockstepStep:
        t0 = time.perf_counter()
        with VLLM_LOCK:
            done = self.lockstep.step()
        self.step_times.append(time.perf_counter() - t0)
        return done

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with VLLM_LOCK:
            self.lockstep.close()
        self.ours.close()
