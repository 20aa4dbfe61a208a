"""A pool too small for every request at once: preempt, and outputs do not change."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all

PROMPTS = [list(range(1, 6)), list(range(10, 17)), list(range(40, 48))]
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def outputs(eng):
    return [eng.get_output(r).outputs[0].token_ids for r in ("0", "1", "2")]


@pytest.fixture(scope="module")
def unconstrained(tiny_llama):
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64))
    for p in PROMPTS:
        eng.add_request(p, PARAMS)
    results = run_all(eng)
    assert not any(e.kind == "preempt" for r in results for e in r.events)
    return outputs(eng)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_greedy_outputs(tiny_llama, unconstrained, mode):
    # all three are admitted (2 blocks each) but grow to 8 blocks each: 24 > 14, so the
    # scheduler must preempt; each still fits alone
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=14,
                              preemption_mode=mode, num_cpu_blocks=32 if mode == "swap" else 0))
    for p in PROMPTS:
        eng.add_request(p, PARAMS)
    results = run_all(eng)
    seen = [e for r in results for e in r.events]
    preempts = [e for e in seen if e.kind == "preempt"]
    assert preempts and all(e.mode == mode for e in preempts)
    if mode == "swap":
        assert any(e.kind == "swap_out" for e in seen)
        assert any(e.kind == "swap_in" for e in seen)
    else:   # a recomputed sequence is prefilled again, prompt and generated tokens alike
        again = [e for e in seen if e.kind == "prefill" and e.end > len(PROMPTS[int(eng.snapshot.seq(e.seq_id).request_id)])]
        assert again
    assert outputs(eng) == unconstrained
    assert eng.snapshot.stats.used_blocks == 0 and eng.snapshot.stats.cpu_used_blocks == 0


def test_v0_decodes_only_with_a_free_block_per_running_sequence():
    """vLLM v0's can_append_slots is a worst-case rule: a decode needs one free block per
    running sequence even when the token fits in its last block. A 2-block pool (block_size 16)
    and a 17-token prompt with 3 new tokens: both blocks are held and none is free, so vLLM v0
    preempts the request before each decode (twice) and the recompute prefills sample the
    tokens."""
    from engine import Engine, EngineConfig, SamplingParams
    eng = Engine.length_only(EngineConfig(block_size=16, num_gpu_blocks=2))
    rid = eng.add_request(list(range(4, 21)), SamplingParams(max_tokens=3, ignore_eos=True))
    results = []
    while eng.has_unfinished_requests():
        results.append(eng.step())
        eng.check_invariants()
    assert [r.kind for r in results] == ["prefill", "idle", "prefill", "idle", "prefill"]
    assert len([e for r in results for e in r.events if e.kind == "preempt"]) == 2
    assert len(eng.get_output(rid).outputs[0].token_ids) == 3


def test_a_swap_out_in_a_step_that_computes_nothing_still_copies_the_kv(tiny_llama):
    """Under v0's worst-case decode rule a step can preempt every running group and compute
    nothing; the groups it swaps out must still have their K/V copied to the CPU pool, or they
    come back with garbage (their greedy tokens would change)."""
    from engine import Engine, EngineConfig, SamplingParams

    def run(blocks: int):
        eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=blocks,
                                  num_cpu_blocks=64, preemption_mode="swap"))
        a = eng.add_request([5, 6, 7, 8, 9], SamplingParams(n=4, temperature=1.0, seed=1,
                                                            max_tokens=6, ignore_eos=True))
        b = eng.add_request([11, 12, 13, 14, 15], SamplingParams(max_tokens=8, ignore_eos=True))
        results = []
        while eng.has_unfinished_requests():
            results.append(eng.step())
            eng.check_invariants()
        return eng.get_output(b).outputs[0].token_ids, results, eng.get_output(a)
    tight, results, _ = run(12)
    roomy, _, _ = run(64)
    assert any(r.kind == "idle" and any(e.kind == "swap_out" for e in r.events) for r in results)
    assert tight == roomy
