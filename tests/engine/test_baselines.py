"""Contiguous baselines and waste accounting on hand-computed cases."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.observe.accounting import summarize
from engine.observe.baselines import ContiguousAllocator, FirstFitSpace
from engine.observe.baselines.contiguous import reservation
from analysis.workloads import ALPACA, SHAREGPT, run_trace, synthetic_trace


def by_name(snapshot):
    return {a.allocator: a for a in snapshot.accounting}


def test_one_request_paged_vs_each_baseline():
    eng = Engine.length_only(EngineConfig(block_size=16, num_gpu_blocks=256), max_model_len=2048)
    eng.add_request(list(range(4, 24)), SamplingParams(max_tokens=5, ignore_eos=True))  # 20 tokens
    acc = by_name(eng.step().snapshot)
    paged = acc["paged"]
    assert eng.snapshot.stats.used_blocks == 2
    assert (paged.token_states, paged.internal_fragmentation) == (20, 12)   # 12 slack slots
    assert paged.reserved == 0 and paged.external_fragmentation == 0
    assert paged.free == 254 * 16
    # baselines: 20 prompt + 5 output tokens; token states count the 20 + 1st output - 1
    assert acc["max"].token_states + acc["max"].reserved + acc["max"].internal_fragmentation == 2048
    assert acc["max"].internal_fragmentation == 2048 - 25
    assert acc["pow2"].token_states + acc["pow2"].reserved + acc["pow2"].internal_fragmentation == 32
    assert acc["oracle"].internal_fragmentation == 0 and acc["oracle"].reserved == 5
    assert {a.token_states for a in acc.values()} == {20}
    assert 0.6 < paged.token_state_share < 0.7 and acc["max"].token_state_share < 0.01


def test_reservation_sizes():
    assert reservation("max", 20, 5, 2048) == 2048
    assert reservation("pow2", 20, 5, 2048) == 32
    assert reservation("pow2", 20, 12, 2048) == 32
    assert reservation("pow2", 20, 13, 2048) == 64
    assert reservation("oracle", 20, 5, 2048) == 25
    with pytest.raises(ValueError, match="policy"):
        reservation("buddy", 1, 1, 8)


def test_first_fit_merges_holes():
    space = FirstFitSpace(100)
    a, b, c = space.allocate(30), space.allocate(30), space.allocate(30)
    assert (a, b, c) == (0, 30, 60)
    space.free(a)
    space.free(c)
    assert space.holes == [[0, 30], [60, 40]] and space.free_total == 70
    assert space.allocate(50) is None            # 70 free, but no hole of 50
    space.free(b)
    assert space.holes == [[0, 100]]


def test_fragmented_space_makes_a_request_wait():
    alloc = ContiguousAllocator("oracle", capacity_slots=100, max_model_len=100)
    alloc.add("a", 20, 10)      # 30 slots, lives 10 steps
    alloc.add("b", 20, 30)      # 50 slots, lives 30 steps
    alloc.add("c", 10, 10)      # 20 slots, lives 10 steps: fills the space
    alloc.step()                # all three admitted: [a 0-30][b 30-80][c 80-100]
    for _ in range(9):
        alloc.step()
    assert alloc.finished == 2 and alloc.space.holes == [[0, 30], [80, 20]]
    alloc.add("d", 30, 10)      # needs 40: 50 are free, but in holes of 30 and 20
    alloc.step()
    row = alloc.accounting()
    assert row["waiting"] == 1 and row["running_requests"] == 1
    assert row["external_fragmentation"] == 50 and row["free"] == 0


def test_width_reserves_per_sequence():
    alloc = ContiguousAllocator("oracle", capacity_slots=1000, max_model_len=1000)
    alloc.add("beam", 10, 10, width=4)
    alloc.step()
    row = alloc.accounting()
    assert row["token_states"] + row["reserved"] + row["internal_fragmentation"] == 80


def test_length_only_runner_matches_the_real_engine(tiny_llama):
    memory_kinds = {"alloc", "free", "fork", "cow", "prefill", "preempt", "swap_out", "swap_in",
                    "finish"}

    def memory_events(eng):
        out = []
        while eng.has_unfinished_requests():
            out.append([{k: v for k, v in e.to_dict().items() if k != "token_id"}
                        for e in eng.step().events if e.kind in memory_kinds | {"append"}])
        return out

    requests = [(list(range(4, 11)), SamplingParams(max_tokens=9, ignore_eos=True)),
                (list(range(20, 39)), SamplingParams(n=3, temperature=1.0, max_tokens=7,
                                                     ignore_eos=True)),
                (list(range(40, 45)), SamplingParams(max_tokens=12, ignore_eos=True))]
    cfg = EngineConfig(block_size=4, num_gpu_blocks=16, preemption_mode="swap", num_cpu_blocks=16)
    real = Engine(EngineConfig(**{**cfg.__dict__, "model": tiny_llama[0]}))
    sim = Engine.length_only(cfg, max_model_len=256)
    for prompt, params in requests:
        real.add_request(prompt, params)
        sim.add_request(prompt, params)
    real_events, sim_events = memory_events(real), memory_events(sim)
    assert real_events == sim_events
    flat = {e["kind"] for step in real_events for e in step}
    assert {"fork", "cow", "preempt", "swap_out", "swap_in"} <= flat


@pytest.mark.parametrize("spec", [SHAREGPT, ALPACA])
def test_synthetic_traces_match_the_paper_means(spec):
    trace = synthetic_trace(spec, 4000, rate_per_step=1.0, seed=0)
    assert abs(trace.prompt_len.mean() / spec.mean_input - 1) < 0.08
    assert abs(trace.output_len.mean() / spec.mean_output - 1) < 0.08
    assert (trace.prompt_len + trace.output_len).max() <= 2048
    assert trace.arrival_step.is_monotonic_increasing
    assert trace.equals(synthetic_trace(spec, 4000, rate_per_step=1.0, seed=0))


def test_small_trace_accounting_frame():
    eng = Engine.length_only(EngineConfig(block_size=16, num_gpu_blocks=64), max_model_len=512)
    trace = synthetic_trace(ALPACA, 30, rate_per_step=2.0, seed=1, max_model_len=512)
    steps = run_trace(eng, trace)
    frame = eng.accounting_frame()
    assert len(frame) == 4 * steps and set(frame.allocator) == {"paged", "max", "pow2", "oracle"}
    summary = summarize(frame)
    assert summary.loc["paged", "token_states_%"] > summary.loc["oracle", "token_states_%"]
    assert summary.loc["paged", "finished"] == 30
    eng.check_invariants()


def test_baselines_follow_early_finish_abort_and_report_rejections():
    alloc = ContiguousAllocator("oracle", capacity_slots=100, max_model_len=100)
    alloc.add("big", 80, 40)                   # 120 slots: can never fit
    alloc.add("a", 10, 20)
    alloc.add("b", 10, 70)                     # 80: waits behind a (30)
    alloc.step()
    assert alloc.accounting()["rejected"] == 1 and alloc.accounting()["waiting"] == 1
    alloc.set_output_len("b", 5)               # finished early in the engine: shrinks to 15
    alloc.step()
    assert [r.request_id for r in alloc.running] == ["a", "b"]
    alloc.set_output_len("a", 1)               # a already generated 1 token: retires now
    assert alloc.finished == 1
    alloc.abort("b")
    assert not alloc.has_unfinished() and alloc.space.free_total == 100


def test_swap_mode_never_deadlocks_on_a_tight_pool():
    # a forked group swapped out must come back although its width exceeds the spare blocks
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=4, num_cpu_blocks=64,
                                          preemption_mode="swap"), max_model_len=64)
    outs = eng.generate([[4], list(range(20, 26))],
                        [SamplingParams(max_tokens=2, ignore_eos=True),
                         SamplingParams(n=3, temperature=1.0, max_tokens=2, ignore_eos=True)])
    assert [len(o.outputs) for o in outs] == [1, 3]
    eng.check_invariants()
