"""The same requests at every block size: how much allocated KV holds token states, and how
many requests run at once (the vLLM paper's Fig. 2 point, swept over the page size).

Each block size runs the requests to completion on the length-only engine (the real block
manager and scheduler, no model: outputs are exactly ``max_tokens`` long) with a pool of the
same capacity in token slots, and averages over the run's steps: token states / allocated slots
(the rest is last-block slack) and the number of running requests. Requests the length replay
runs exactly (analysis/length_replay.py: n = 1, ignore_eos, no stop strings) are replayed on
their lengths instead, with the same result in a fraction of the time.
"""
from __future__ import annotations

import pandas as pd

from engine.config import EngineConfig
from analysis.length_replay import replay_trace, unsupported
from engine.llm_engine import Engine
from engine.sampling_params import SamplingParams

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def block_size_sweep(requests: list[tuple[int, SamplingParams]], capacity_slots: int,
                     block_sizes=BLOCK_SIZES, max_model_len: int = 2048,
                     arrivals: list[int] | None = None, replay: bool | None = None) -> pd.DataFrame:
    """``requests``: (prompt length, params) pairs; ``arrivals``: the step each arrives at
    (default: all at once). One row per block size whose pool holds every request.
    ``replay``: use the length replay (None: whenever it supports the requests)."""
    if replay is None:
        replay = all(unsupported(EngineConfig(), p) is None for _, p in requests)
    rows = []
    for bs in block_sizes:
        blocks = capacity_slots // bs
        if blocks < 1:
            continue
        config = EngineConfig(block_size=bs, num_gpu_blocks=blocks, max_num_seqs=1024,
                              max_history=1)
        run = (_replayed if replay else _engine_run)(requests, config, max_model_len, arrivals)
        if run is not None and run[-1]:
            token, allocated, running, steps = run
            rows.append({"block_size": bs, "token_state_share": token / allocated if allocated else 1.0,
                         "mean_running_requests": running / steps, "steps": steps})
    return pd.DataFrame(rows)


def _engine_run(requests, config: EngineConfig, max_model_len: int, arrivals):
    """(token states, allocated slots, running requests) summed over the steps, and the
    steps; None when a request cannot fit this pool."""
    eng = Engine.length_only(config, max_model_len=max_model_len)
    due = sorted(zip(arrivals or [0] * len(requests), range(len(requests))))
    token, allocated, running, steps = 0, 0, 0, 0
    while due or eng.has_unfinished_requests():
        while due and due[0][0] <= steps:
            plen, params = requests[due.pop(0)[1]]
            try:
                eng.add_request([1 + i % 50 for i in range(plen)], params)
            except ValueError:          # could never fit a pool of this block size
                return None
        eng.step()
        steps += 1
        paged = eng.snapshot.accounting[0]
        token += paged.token_states
        allocated += paged.token_states + paged.internal_fragmentation
        running += len(eng.scheduler.running)
    return token, allocated, running, steps


def _replayed(requests, config: EngineConfig, max_model_len: int, arrivals):
    """The same sums from the length replay's paged rows."""
    due = sorted(zip(arrivals or [0] * len(requests), range(len(requests))))
    trace = pd.DataFrame({"arrival_step": [a for a, _ in due],
                          "prompt_len": [requests[k][0] for _, k in due],
                          "output_len": [requests[k][1].max_tokens for _, k in due]})
    try:
        frame, info = replay_trace(trace, config, max_model_len=max_model_len, baselines=False)
    except ValueError:                  # could never fit a pool of this block size
        return None
    if not info["steps"]:
        return 0, 0, 0, 0
    return (int(frame.token_states.sum()),
            int((frame.token_states + frame.internal_fragmentation).sum()),
            int(frame.running.sum()), info["steps"])
