"""The length-only engine's rules, replayed on lengths alone: per-step KV accounting at scale.

With every request n = 1 and ``ignore_eos`` (outputs exactly ``max_tokens`` long, the default
of analysis/workloads.run_trace), the v0 engine with recompute preemption and no prefix caching
decides nothing from token or block ids, only from how many tokens each request holds. So this
replays the same rules on those counts and returns what ``Engine.accounting_frame()`` would:

- a step admits waiting requests in arrival order (``SchedulerV0._admit_prefills``) while the pool
  holds the head's prompt blocks, a block for its first decode (only the block it really takes
  when it would run alone), and a block for the next decode of everything running (vLLM v0's
  worst-case rule); after the first, while the step's tokens fit ``max_num_batched_tokens``;
  while the running requests stay within ``max_num_seqs``. Such a step is a prefill step: only
  the admitted requests compute (all their tokens) and sample;
- otherwise every running request decodes one token (``SchedulerV0._decode``), in arrival order;
  each needs a free block at its turn, even when its token fits in its last block (vLLM v0's
  ``can_append_slots``); one that finds none preempts the latest-arrived request not yet served
  (itself when nobody is behind it), which frees its blocks and waits again, by arrival order,
  to be prefilled again with all its tokens;
- a request finishes when it samples its ``max_tokens``-th token; its blocks are freed after
  the step's samples;
- the Max / Pow2 / Oracle baselines serve the same stream in lockstep
  (analysis/contiguous_replay.py).

Block ids don't matter without prefix caching, so a request is only a token count: a running
request's cached tokens are ``base + D``, D the decode steps so far, and it takes a block at a
decode when ``(base + D) % block_size == 0``. Counting running requests by ``base % block_size``
makes a quiet decode step (no arrival, finish, admission or preemption) O(1). Anything this does
not replay exactly (v1, swap, prefix caching, n > 1, beams, EOS or stop strings) is refused with
a ValueError. tests/engine/test_length_replay.py checks it against the engine row for row, and
bench/waste.py does on the first 200 requests of each trace on every run.
"""
from __future__ import annotations

from array import array
from bisect import insort
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.observe.baselines import POLICIES
from analysis.contiguous_replay import replay_contiguous
from engine.config import EngineConfig
from engine.core.block_math import cdiv
from engine.core.worst_case import kv_tokens_at_most
from engine.processing.input_processor import resolve_max_model_len
from engine.sampling_params import SamplingParams
from engine.sched.registry import semantics_of
from engine.sched.v0 import V0Semantics


def unsupported(config: EngineConfig, params: SamplingParams | None = None) -> str | None:
    """Why the replay would not match the engine for this config (and request params), or
    None when it does."""
    if not isinstance(semantics_of(config.semantics), V0Semantics):
        return f"semantics={config.semantics!r}: only v0's scheduler is replayed"
    if config.preemption_mode != "recompute":
        return f"preemption_mode={config.preemption_mode!r}: only recompute is replayed"
    if config.prefix_caching:
        return "prefix caching: cache hits depend on token ids, which the replay has none of"
    if not config.observe:
        return "observe=False: such an engine keeps no accounting to compare with"
    if params is not None:
        if params.n != 1 or params.use_beam_search:
            return "n > 1 or beam search: the replay runs one sequence per request"
        if not params.ignore_eos:
            return "ignore_eos=False: an EOS would end a request before max_tokens"
        if params.stop:
            return "stop strings: they would end a request before max_tokens"
        if params.stop_token_ids:
            return "stop_token_ids: they would end a request before max_tokens"
    return None


@dataclass(frozen=True)
class PagedRun:
    steps: int
    preemptions: int              # Preempt events (one per sequence; n = 1)
    finished: int
    # after each step: tokens with K/V, free blocks, running / waiting / finished requests
    token_states: np.ndarray
    free_blocks: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    finished_so_far: np.ndarray


def replay_paged(add_step, prompt_len, output_len, block_size: int, num_blocks: int,
                 max_num_seqs: int, max_num_batched_tokens: int,
                 max_steps: int = 1_000_000) -> PagedRun:
    """The v0 scheduler and block manager on lengths; ``add_step[i]`` is the 0-based step
    before which request i is added (non-decreasing), as run_trace adds them, and like
    run_trace it gives up (RuntimeError) at ``max_steps``."""
    bs = block_size
    n = len(prompt_len)
    P, end = list(prompt_len), [p + o for p, o in zip(prompt_len, output_len)]
    add_step = list(add_step)
    tokens_of = list(P)           # a waiting request's tokens (prompt + generated so far)
    base = [0] * n                # a running request caches base + D tokens
    waiting: list[int] = []       # request ids are arrival order
    running: list[int] = []
    by_residue = [0] * bs         # running requests by base % bs
    finishing: dict[int, list[int]] = {}   # D of the decode that samples a request's last token
    free, tokens, D, finished, preempted = num_blocks, 0, 0, 0, 0
    # the head failed to be admitted and nothing has freed blocks or seats since: free minus
    # the running requests' next-decode blocks never grows over decode steps, so it still fails
    blocked = False
    col_tokens, col_free, col_running, col_waiting, col_finished = (array("q") for _ in range(5))

    def preempt(v: int) -> None:
        nonlocal free, tokens, preempted
        c = base[v] + D
        free += cdiv(c, bs)
        tokens -= c
        by_residue[base[v] % bs] -= 1
        finishing[end[v] - base[v] - 2].remove(v)
        tokens_of[v] = c + 1
        insort(waiting, v)
        preempted += 1

    s = i = 0
    while i < n or running or waiting:
        while i < n and add_step[i] <= s:
            blocked = blocked and bool(waiting)
            waiting.append(i)
            i += 1
        admitted = 0
        if waiting and not blocked and len(running) < max_num_seqs:
            reserved = len(running)   # their next decode: a free block each (v0's worst case)
            batch_tokens = 0
            done = []
            while waiting:
                h = waiting[0]
                t = tokens_of[h]
                need = cdiv(t, bs)
                then = 1 if t % bs == 0 and t + 1 < end[h] else 0   # first_decode_blocks
                alone = not running and not admitted       # then only its exact first decode
                if need + (then if alone else 1) + reserved > free:
                    break
                if admitted and batch_tokens + t > max_num_batched_tokens:
                    break
                if len(running) + len(done) + 1 > max_num_seqs:
                    break
                reserved += 1
                del waiting[0]
                free -= need
                batch_tokens += t
                admitted += 1
                if t + 1 >= end[h]:          # samples its last token in this prefill
                    done.append(need)
                    continue
                b = base[h] = t - D
                by_residue[b % bs] += 1
                finishing.setdefault(end[h] - b - 2, []).append(h)
                insort(running, h)
                tokens += t
            free += sum(done)                 # freed after the step's samples
            finished += len(done)
        blocked = bool(waiting) and not admitted
        if not admitted and running:
            r = -D % bs
            if by_residue[r] < free:   # everyone finds a free block (the last one too) and
                # gets the block it needs
                free -= by_residue[r]
                tokens += len(running)
            else:
                kept = []
                lo, hi = 0, len(running)
                while lo < hi:
                    g = running[lo]
                    lo += 1
                    need = 1 if base[g] % bs == r else 0
                    # v0's worst-case rule: a free block, even when it takes none
                    while free < 1 and lo < hi:       # the latest arrival not yet served
                        hi -= 1
                        preempt(running[hi])
                    if free < 1:                      # nobody behind it: preempts itself
                        preempt(g)
                        continue
                    free -= need
                    kept.append(g)
                running = kept
                tokens += len(kept)
                blocked = False
            D += 1
            for h in finishing.pop(D - 1, ()):
                blocked = False
                c = base[h] + D
                free += cdiv(c, bs)
                tokens -= c
                by_residue[base[h] % bs] -= 1
                running.remove(h)
                finished += 1
        s += 1
        col_tokens.append(tokens)
        col_free.append(free)
        col_running.append(len(running))
        col_waiting.append(len(waiting))
        col_finished.append(finished)
        if s >= max_steps:
            raise RuntimeError(f"trace did not finish within {max_steps} steps")
    as_np = [np.frombuffer(c, dtype=np.int64) if len(c) else np.zeros(0, dtype=np.int64)
             for c in (col_tokens, col_free, col_running, col_waiting, col_finished)]
    return PagedRun(s, preempted, finished, *as_np)


def _requests(trace: pd.DataFrame, config: EngineConfig, max_model_len: int, make_params):
    """(add step, prompt lengths, output lengths), refused as the engine would refuse them."""
    prompt = [int(p) for p in trace.prompt_len]
    if make_params is None:
        output = [int(o) for o in trace.output_len]
        if any(o < 1 for o in output):
            raise ValueError("invalid SamplingParams: max_tokens must be an integer >= 1")
    else:
        output = []
        for o in trace.output_len:
            params = make_params(o)
            reason = unsupported(config, params)
            if reason:
                raise ValueError(f"the length replay cannot run this request: {reason}")
            output.append(params.max_tokens)       # None: up to max_model_len (capped below)
    # run_trace adds a row at the first step >= its arrival once every row before it was added
    arrival = np.ceil(trace.arrival_step.to_numpy(dtype=float))
    add_step = np.maximum.accumulate(np.maximum(arrival, 0)) if len(trace) else arrival
    for k, (p, o) in enumerate(zip(prompt, output)):       # InputProcessor.check's rules
        if p < 1:
            raise ValueError(f"request {k}: the prompt is empty")
        if p >= max_model_len:
            raise ValueError(f"request {k}: the prompt has {p} tokens; max_model_len "
                             f"({max_model_len} tokens) leaves no room for a new token")
        o = output[k] = max_model_len - p if o is None else min(o, max_model_len - p)
        if p > config.max_num_batched_tokens:
            raise ValueError(f"request {k}: the prompt has {p} tokens but v0 prefills a prompt "
                             f"in one step of at most max_num_batched_tokens "
                             f"({config.max_num_batched_tokens}) tokens")
        need = cdiv(kv_tokens_at_most(p, o), config.block_size)
        if need > config.num_gpu_blocks:
            raise ValueError(f"request {k} can need {need} KV blocks but the pool has only "
                             f"{config.num_gpu_blocks}: it could never run")
    return [int(a) for a in add_step], prompt, output


def replay_trace(trace: pd.DataFrame, config: EngineConfig | None = None, *,
                 max_model_len: int = 2048, make_params=None, baselines: bool = True,
                 max_steps: int = 1_000_000) -> tuple[pd.DataFrame, dict]:
    """What ``run_trace(Engine.length_only(config, max_model_len=...), trace, make_params)``
    followed by ``accounting_frame()`` gives, and info (steps, preemptions, finished).
    ``baselines=False``: the paged rows only."""
    config = config or EngineConfig()
    reason = unsupported(config)
    if reason:
        raise ValueError(f"the length replay cannot run this configuration: {reason}")
    mml = resolve_max_model_len(config.max_model_len, max_model_len)
    add_step, prompt, output = _requests(trace, config, mml, make_params)
    bs = config.block_size
    run = replay_paged(add_step, prompt, output, bs, config.num_gpu_blocks, config.max_num_seqs,
                       config.max_num_batched_tokens, max_steps)
    info = {"steps": run.steps, "preemptions": run.preemptions, "finished": run.finished}
    used = config.num_gpu_blocks - run.free_blocks
    zeros = np.zeros(run.steps, dtype=np.int64)
    tables = [{"token_states": run.token_states, "reserved": zeros,
               "internal_fragmentation": used * bs - run.token_states,
               "external_fragmentation": zeros, "free": run.free_blocks * bs,
               "running": run.running, "waiting": run.waiting, "finished": run.finished_so_far,
               "rejected": zeros}]
    names = ["paged"]
    if baselines:
        # the same usable capacity as the paged pool (Engine: num_usable * block_size)
        capacity = config.num_gpu_blocks * bs
        for policy in POLICIES:
            tables.append(replay_contiguous(policy, capacity, mml, add_step, prompt, output,
                                            run.steps))
            names.append(policy)
    return _frame(names, tables, run.steps), info


def _frame(names: list[str], tables: list[dict], steps: int) -> pd.DataFrame:
    """accounting_frame's layout: one row per (step, allocator), allocators in order."""
    if not steps:
        return pd.DataFrame([])
    k = len(names)
    cols = {"step": np.repeat(np.arange(1, steps + 1, dtype=np.int64), k),
            "allocator": np.tile(np.array(names, dtype=object), steps)}
    for c in tables[0]:
        cols[c] = np.column_stack([t[c] for t in tables]).ravel()
    busy = (cols["token_states"] + cols["reserved"] + cols["internal_fragmentation"]
            + cols["external_fragmentation"])
    cols["token_state_share"] = np.where(busy > 0, cols["token_states"] / np.maximum(busy, 1), 1.0)
    return pd.DataFrame(cols)
