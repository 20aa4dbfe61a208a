"""Differential test: the length replay (analysis/length_replay.py) gives the length-only
engine's accounting frame row for row, and its preemption count.

Random small traces (lengths, arrivals -- bursts, gaps with idle steps, rows out of arrival
order), block sizes 1..16, pools from one block above the largest request (preemption, and
external fragmentation in the baselines) to roomy, and small ``max_num_seqs`` and
``max_num_batched_tokens`` run through the engine exactly as bench/waste.py runs it
(``Engine.length_only`` + ``run_trace``) and through the replay; the frames must be equal.
"""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st, target

from engine import Engine, EngineConfig, SamplingParams
from engine.core.block_math import cdiv
from analysis.block_size_sweep import block_size_sweep
from analysis.length_replay import replay_trace
from analysis.workloads import ALPACA, SHAREGPT, run_trace, synthetic_trace


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The length-only engine's tensors are tiny: on a busy 2-core machine a second intra-op
    thread made it several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def engine_run(trace: pd.DataFrame, config: EngineConfig, max_model_len: int, make_params=None):
    """As bench/waste.py runs a trace (--engine engine)."""
    eng = Engine.length_only(config, max_model_len=max_model_len)
    steps = run_trace(eng, trace, make_params)
    return eng.accounting_frame(), {"steps": steps, "preemptions": eng.event_counts["preempt"],
                                    "finished": eng.num_finished}


def assert_same(trace: pd.DataFrame, config: EngineConfig, max_model_len: int) -> dict:
    expected, expected_info = engine_run(trace, config, max_model_len)
    frame, info = replay_trace(trace, config, max_model_len=max_model_len)
    pd.testing.assert_frame_equal(frame, expected)
    assert info == expected_info
    return info


requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(0, 4)),
                    min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, shuffled=st.booleans(), block_size=st.sampled_from([1, 2, 4, 8, 16]),
       extra_blocks=st.sampled_from([0, 0, 1, 2, 4, 8, 64]),
       max_model_len=st.sampled_from([48, 80, 256]),
       max_num_seqs=st.sampled_from([1, 2, 3, 256]),
       max_num_batched_tokens=st.sampled_from([1, 24, 64, 4096]))
def test_replay_matches_the_engine(reqs, shuffled, block_size, extra_blocks, max_model_len,
                                   max_num_seqs, max_num_batched_tokens):
    # a v0 prompt is prefilled in one step, so it fits the step's budget (or is refused)
    prompt = [min(p, max_model_len - 1, max_num_batched_tokens) for p, _, _ in reqs]
    output = [min(o, max_model_len - p) for p, (_, o, _) in zip(prompt, reqs)]
    arrivals = [g for _, _, g in reqs] if shuffled else \
        pd.Series([g for _, _, g in reqs]).cumsum().tolist()     # gaps: idle steps
    trace = pd.DataFrame({"arrival_step": arrivals, "prompt_len": prompt, "output_len": output})
    largest = max(cdiv(p + o - 1, block_size) for p, o in zip(prompt, output))
    config = EngineConfig(block_size=block_size, num_gpu_blocks=largest + extra_blocks,
                          max_history=1, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens)
    info = assert_same(trace, config, max_model_len)
    target(float(info["preemptions"]), label="preemptions")


@pytest.mark.parametrize("spec", [SHAREGPT, ALPACA])
def test_replay_matches_the_engine_on_the_bench_setup(spec):
    """bench/waste.py's setup: block 16, 1024 blocks, Poisson arrivals at 2 per step."""
    trace = synthetic_trace(spec, 200, rate_per_step=2.0, seed=0)
    config = EngineConfig(block_size=16, num_gpu_blocks=1024, seed=0, max_history=1,
                          max_model_len=2048)
    info = assert_same(trace, config, 2048)
    if spec is SHAREGPT:          # the v0 scheduler thrashes here: preemption is exercised
        assert info["preemptions"] > 20


def test_sampled_requests_with_their_own_max_tokens_replay_too():
    """Sampling (temperature, seed) does not change lengths under ignore_eos; max_tokens, not
    the trace's output_len, is what runs."""
    trace = synthetic_trace(SHAREGPT, 40, rate_per_step=1.0, seed=2, max_model_len=512)

    def make(out):
        return SamplingParams(max_tokens=int(out) // 2 + 1, temperature=0.9, top_k=8,
                              ignore_eos=True)
    config = EngineConfig(block_size=8, num_gpu_blocks=80, max_history=1)
    expected, expected_info = engine_run(trace, config, 512, make)
    frame, info = replay_trace(trace, config, max_model_len=512, make_params=make)
    pd.testing.assert_frame_equal(frame, expected)
    assert info == expected_info and info["preemptions"] > 0


def test_a_request_that_can_never_fit_is_refused_like_the_engine():
    trace = pd.DataFrame({"arrival_step": [0, 1], "prompt_len": [5, 60], "output_len": [5, 10]})
    config = EngineConfig(block_size=4, num_gpu_blocks=8, max_history=1)
    with pytest.raises(ValueError):
        engine_run(trace, config, 256)
    with pytest.raises(ValueError, match="never run"):
        replay_trace(trace, config, max_model_len=256)
    no_room = pd.DataFrame({"arrival_step": [0, 1], "prompt_len": [5, 64], "output_len": [5, 10]})
    with pytest.raises(ValueError, match="max_model_len"):
        replay_trace(no_room, EngineConfig(block_size=4, num_gpu_blocks=64), max_model_len=64)
    # a v0 prompt longer than the step budget: both refuse it, naming the budget
    budget = EngineConfig(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=16, max_history=1)
    long = pd.DataFrame({"arrival_step": [0], "prompt_len": [20], "output_len": [2]})
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        engine_run(long, budget, 256)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        replay_trace(long, budget, max_model_len=256)


@pytest.mark.parametrize("config, match", [
    (EngineConfig(semantics="v1"), "v0"),
    (EngineConfig(preemption_mode="swap", num_cpu_blocks=8), "recompute"),
    (EngineConfig(enable_prefix_caching=True), "prefix caching"),
    (EngineConfig(observe=False), "observe"),
])
def test_unsupported_configs_are_refused(config, match):
    trace = synthetic_trace(ALPACA, 3, rate_per_step=1.0)
    with pytest.raises(ValueError, match=match):
        replay_trace(trace, config)


@pytest.mark.parametrize("params, match", [
    (dict(n=2, temperature=1.0), "n > 1"),
    (dict(beam_width=2), "beam"),
    (dict(ignore_eos=False), "EOS"),
    (dict(stop=["x"]), "stop"),
])
def test_unsupported_requests_are_refused(params, match):
    trace = synthetic_trace(ALPACA, 3, rate_per_step=1.0)
    def make(out):
        return SamplingParams(**{"max_tokens": int(out), "ignore_eos": True, **params})
    with pytest.raises(ValueError, match=match):
        replay_trace(trace, EngineConfig(), make_params=make)


def test_block_size_sweep_replays_what_the_engine_runs():
    trace = synthetic_trace(ALPACA, 24, rate_per_step=2.0, seed=3, max_model_len=256)
    reqs = [(int(p), SamplingParams(max_tokens=int(o), ignore_eos=True))
            for p, o in zip(trace.prompt_len, trace.output_len)]
    kw = dict(capacity_slots=256, block_sizes=(1, 8, 128), max_model_len=256,
              arrivals=[int(a) for a in trace.arrival_step])
    pd.testing.assert_frame_equal(block_size_sweep(reqs, replay=True, **kw),
                                  block_size_sweep(reqs, replay=False, **kw))
