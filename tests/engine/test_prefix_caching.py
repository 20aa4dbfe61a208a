"""Prefix caching (vLLM v1 style): full blocks hashed by chained content, reused by hash."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all

PREFIX = list(range(50, 82))          # 32 tokens = 2 full blocks of 16
A = PREFIX + [5, 6, 7]
B = PREFIX + [9, 10, 11, 12, 13]
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)


def test_second_request_reuses_the_cached_prefix(tiny_llama):
    path, _ = tiny_llama
    plain = Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=32))
    expected = [o.outputs[0].token_ids for o in plain.generate([A, B], PARAMS)]

    eng = Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=32,
                              enable_prefix_caching=True))
    eng.add_request(A, PARAMS)
    run_all(eng)
    cached = {b.block_id for b in eng.snapshot.blocks if b.state == "cached"}
    assert len(cached) == 2        # the prefix's blocks stay cached after request A finished

    eng.add_request(B, PARAMS)
    first = eng.step()
    hits = [e for e in first.events if e.kind == "prefix_hit"]
    assert [h.logical for h in hits] == [0, 1]
    assert {h.physical for h in hits} == cached
    allocs = [e for e in first.events if e.kind == "alloc"]
    assert all(a.logical >= 2 for a in allocs) and len(allocs) == 1
    prefill = next(e for e in first.events if e.kind == "prefill")
    assert (prefill.start, prefill.end) == (32, len(B))       # only the suffix is computed
    run_all(eng)
    got = [eng.get_output(r).outputs[0].token_ids for r in ("0", "1")]
    assert got == expected


def test_requests_in_one_batch_share_prefix_blocks(tiny_llama):
    path, _ = tiny_llama
    eng = Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=32,
                              enable_prefix_caching=True))
    eng.add_request(A, PARAMS)
    eng.add_request(B, PARAMS)
    first = eng.step()
    assert len([e for e in first.events if e.kind == "prefix_hit"]) == 2
    a, b = first.snapshot.sequences
    assert a.block_table[:2] == b.block_table[:2]
    assert first.snapshot.blocks[a.block_table[0]].ref_count == 2
    run_all(eng)


def test_the_v0_prefill_budget_counts_only_the_tokens_computed():
    """vLLM v0's _schedule_prefills checks the token budget with the uncached tokens
    (budget.can_schedule(num_new_tokens=num_new_tokens_uncached)): two 8-token prompts whose
    first block is cached compute 4 tokens each, so both fit a budget of 11 in one step."""
    for caching, together in ((True, True), (False, False)):
        eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16,
                                              max_num_batched_tokens=11,
                                              enable_prefix_caching=caching), max_model_len=11)
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        eng.add_request(list(range(8)), params)
        eng.step()
        eng.step()
        eng.add_request([0, 1, 2, 3, 12, 13, 14, 15], params)
        eng.add_request([0, 1, 2, 3, 16, 17, 18, 19], params)
        prefills = [e for e in eng.step().events if e.kind == "prefill"]
        assert len(prefills) == (2 if together else 1), caching
        if caching:
            assert [(p.start, p.end) for p in prefills] == [(4, 8), (4, 8)]


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_request_outputs_report_the_prompt_tokens_the_cache_served(semantics):
    """vLLM's RequestOutput.num_cached_tokens: the prefix-cache hit, in tokens, when the request
    was first scheduled (whole blocks only, never the last prompt token)."""
    eng = Engine.length_only(EngineConfig(semantics=semantics, block_size=4, num_gpu_blocks=40,
                                          enable_prefix_caching=True))
    prompt = list(range(10))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    first = eng.generate([prompt], params)[0]
    longer = eng.generate([prompt + [50, 51]], params)[0]
    same = eng.generate([prompt[:8]], params)[0]              # 8 tokens: a hit stops at 4
    assert [first.num_cached_tokens, longer.num_cached_tokens, same.num_cached_tokens] == [0, 8, 4]
