"""Random add / step / abort programs keep every memory invariant and leak nothing."""
import math

from hypothesis import HealthCheck, given, settings, strategies as st

from engine import Engine, EngineConfig, SamplingParams

request = st.tuples(
    st.integers(1, 24),                                 # prompt length
    st.integers(1, 12),                                 # max_tokens
    st.sampled_from(["greedy", "sample", "n2", "n3", "beam2", "beam3"]),
    st.booleans(),                                      # ignore_eos
)
action = st.one_of(
    st.tuples(st.just("add"), request),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 10)),
)

KIND = {"greedy": {}, "sample": dict(temperature=1.0), "n2": dict(n=2, temperature=1.0),
        "n3": dict(n=3, temperature=0.7, top_k=8), "beam2": dict(beam_width=2),
        "beam3": dict(beam_width=3)}


def worst_case(plen: int, params: SamplingParams, bs: int) -> int:
    """Written out independently of the engine: the prompt's full blocks shared, then each of
    width sequences owning blocks up to prompt + max_tokens - 1 tokens (the last sampled
    token's K/V is never written)."""
    shared = plen // bs
    longest = plen + params.max_tokens - 1
    return shared + params.width * (math.ceil(longest / bs) - shared)


def step_or_abort(eng, op: str, arg: int, added: list[str]) -> None:
    """A program's "step k" or "abort #k" action, invariants checked after each change."""
    if op == "step":
        for _ in range(arg):
            if eng.has_unfinished_requests():
                eng.step()
                eng.check_invariants()
    elif added:
        eng.abort_request(added[arg % len(added)])
        eng.check_invariants()


def drain(eng, max_steps: int) -> None:
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_invariants()
        steps += 1
        assert steps < max_steps, "no progress"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4, 8, 16]), num_blocks=st.integers(4, 40),
       mode=st.sampled_from(["recompute", "swap"]), caching=st.booleans(),
       program=st.lists(action, min_size=1, max_size=14), seed=st.integers(0, 5))
def test_random_programs_keep_invariants(micro_llama, block_size, num_blocks, mode, caching,
                                         program, seed):
    eng = Engine(EngineConfig(model=micro_llama, block_size=block_size, num_gpu_blocks=num_blocks,
                              num_cpu_blocks=16 if mode == "swap" else 0, preemption_mode=mode,
                              enable_prefix_caching=caching, seed=seed))
    added = []
    for op, arg in program:
        if op == "add":
            plen, max_tokens, kind, ignore_eos = arg
            prompt = [(7 * i + seed) % 60 + 4 for i in range(plen)]   # shared-ish prefixes
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, **KIND[kind])
            before = eng.snapshot.to_dict()
            try:
                added.append(eng.add_request(prompt, params))
            except ValueError:        # could never fit this pool: rejected, nothing changed
                assert worst_case(plen, params, block_size) > num_blocks
                assert eng.snapshot.to_dict() == before
            else:                     # admitted: its worst case fits (and it must complete)
                assert worst_case(plen, params, block_size) <= num_blocks
        else:
            step_or_abort(eng, op, arg, added)
    drain(eng, 2000)
    stats = eng.snapshot.stats
    assert stats.used_blocks == 0 and stats.free_blocks == num_blocks
    assert stats.cpu_used_blocks == 0


V1_KINDS = ["greedy", "sample", "n2", "n3"]      # beam search is refused by v1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(block_size=st.sampled_from([1, 2, 4, 8, 16]), num_blocks=st.integers(4, 40),
       caching=st.booleans(), budget=st.sampled_from([1, 2, 5, 16, 4096]),
       threshold=st.sampled_from([0, 0, 3]),
       program=st.lists(action, min_size=1, max_size=14), seed=st.integers(0, 5))
def test_random_v1_programs_keep_invariants(micro_llama, block_size, num_blocks, caching, budget,
                                            threshold, program, seed):
    """The same under vLLM v1's rules: a request fits when one sequence's longest length fits
    the blocks other than the null block (n > 1 children can preempt each other)."""
    eng = Engine(EngineConfig(model=micro_llama, semantics="v1", block_size=block_size,
                              num_gpu_blocks=num_blocks, enable_prefix_caching=caching, seed=seed,
                              max_num_batched_tokens=budget,
                              long_prefill_token_threshold=threshold))
    added = []
    for op, arg in program:
        if op == "add":
            plen, max_tokens, kind, ignore_eos = arg
            prompt = [(7 * i + seed) % 60 + 4 for i in range(plen)]
            if kind not in V1_KINDS:
                kind = "greedy"
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, **KIND[kind])
            need = math.ceil((plen + max_tokens - 1) / block_size)
            before = eng.snapshot.to_dict()
            try:
                added.append(eng.add_request(prompt, params))
            except ValueError:
                assert need > num_blocks - 1
                assert eng.snapshot.to_dict() == before
            else:
                assert need <= num_blocks - 1
        else:
            step_or_abort(eng, op, arg, added)
    drain(eng, 5000)
    stats = eng.snapshot.stats
    assert stats.used_blocks == 0 and stats.free_blocks == num_blocks - 1
    assert 0 not in eng.bm.gpu.free_queue
