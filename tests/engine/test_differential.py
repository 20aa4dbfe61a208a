"""Differential property test: a tight pool never changes what the model says.

One random program of operations (add a request, step, abort a live request; arrivals
interleaved between steps) runs in lockstep on two engines with the same tiny real model
(``micro_llama``, float32 on the CPU):

* **roomy**: a pool larger than the worst case of all requests together, no prefix caching, so
  it can never preempt (asserted: no ``preempt`` event);
* **small**: a pool only a few blocks above the largest single request, prefix caching on,
  preemption by recompute or by swap (``num_cpu_blocks > 0``), its own block size.

Both use block sizes from {1, 2, 4, 8, 16} drawn independently. Checked:

* ``check_invariants()`` after every step and every abort, in both engines;
* nothing leaks: after draining, every GPU and CPU block of both pools is free;
* identical outputs. Every request that was not aborted must have the same completions in
  both runs: same token ids, finish reasons, and cumulative logprobs (to 1e-4). Greedy and beam
  search are deterministic; sampled requests (n = 1 or n > 1, temperature > 0) carry an
  explicit ``SamplingParams(seed=...)`` that is the same in both runs, and draw from their own
  per-request generator, so their tokens depend only on their own logits.

Aborts, and why the comparison stays sound: the program says "abort request #k" at a fixed
point of the program; it aborts only a request unfinished in *both* engines (so it is aborted in
both, or in neither). The small engine may be behind (preempted, recomputing, swapped), so the
two runs abort it after different numbers of generated tokens. Hence aborted requests are not
compared for equality. Where it is still sound we check consistency: a non-beam request's tokens
at any moment are a prefix of the tokens it would finally have (each sequence's next token
depends only on its own history and its own generator), so per completion one run's partial
output must be a prefix of the other's. Beam search's best beams at different lengths need not be
prefixes of each other, so aborted beam requests are not compared at all.

A request the small pool rejects (``ValueError``: it could never fit) is skipped in both runs;
the pool is sized so that this does not happen with the engine's documented worst case.

What this catches (a wrong K/V block content changes the next logits, so it changes greedy
tokens or at least the logprobs): a CoW that copies the wrong block or is skipped; a fork that
shares a block that is then written; a prefix-cache hit on a block with different tokens or a
stale/evicted block; a swap-out/in that maps blocks wrongly or loses bytes; a recompute that
re-prefills the wrong tokens or positions; wrong slot mappings or block tables at any block
size; beam bookkeeping broken by preemption (pruned/forked beams); a sampled request's
generator consumed differently after preemption; lost or duplicated tokens; early or late
finishing; leaked blocks and refcount errors (invariants + leak check).
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st, target

from engine import Engine, EngineConfig, SamplingParams
from engine.core.block_math import cdiv

VOCAB = 64                      # micro_llama's vocabulary (its EOS id is 3)
BLOCK_SIZES = [1, 2, 4, 8, 16]
# shared prompt bases, so the small (prefix-caching) run gets real cache hits
BASES = [[(7 * i + 13 * k) % (VOCAB - 4) + 4 for i in range(16)] for k in range(3)]
MAX_DRAIN_STEPS = 1000


def make_params(kind: str, max_tokens: int, ignore_eos: bool, seed: int) -> SamplingParams:
    kw = {"greedy": {},
          "sample": dict(temperature=0.8, top_k=16, seed=seed),
          "n2": dict(n=2, temperature=1.0, seed=seed),
          "n3": dict(n=3, temperature=0.7, top_p=0.9, seed=seed),
          "beam2": dict(beam_width=2),
          "beam2e": dict(beam_width=2, early_stopping=True),
          "beam3": dict(beam_width=3, length_penalty=0.5, early_stopping="never")}[kind]
    return SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, **kw)


def worst_case_blocks(prompt_len: int, params: SamplingParams, block_size: int) -> int:
    """The worst-case rule (docs/architecture.md#a-request-fits, Engine.blocks_needed_worst_case): the last sampled token's K/V is never
    written, so a sequence holds at most ceil((prompt + max_tokens - 1) / block_size) blocks."""
    shared = prompt_len // block_size
    per_seq = cdiv(prompt_len + params.max_tokens - 1, block_size) - shared
    return shared + params.width * per_seq


request = st.builds(
    lambda base, keep, tail, max_tokens, kind, ignore_eos, seed: (
        (BASES[base][:keep] + tail) or [5], make_params(kind, max_tokens, ignore_eos, seed)),
    st.integers(0, len(BASES) - 1), st.integers(0, 10),
    st.lists(st.integers(0, VOCAB - 1), max_size=4), st.integers(1, 12),
    st.sampled_from(["greedy", "greedy", "sample", "n2", "n3", "beam2", "beam2e", "beam3"]),
    st.booleans(), st.integers(0, 2 ** 31))
add = st.tuples(st.just("add"), request)
action = st.one_of(
    add, add,                   # arrivals twice as likely: more competition for the small pool
    st.tuples(st.just("step"), st.integers(1, 3)),
    st.tuples(st.just("abort"), st.integers(0, 20)),
)
# a burst of arrivals first (so several requests compete for the small pool), then a mix
programs = st.builds(lambda burst, rest: burst + rest,
                     st.lists(add, min_size=2, max_size=4), st.lists(action, max_size=14))


def step_checked(eng: Engine, preempts: list) -> None:
    result = eng.step()
    eng.check_invariants()
    preempts += [e for e in result.events if e.kind == "preempt"]


def assert_prefix_consistent(a, b, rid: str) -> None:
    """Partial outputs of a non-beam request aborted at different points of generation."""
    ca, cb = a.outputs, b.outputs
    if len(ca) != len(cb):      # n > 1 aborted before its first token in one run: one empty
        short = ca if len(ca) < len(cb) else cb
        assert len(short) == 1 and not short[0].token_ids, f"request {rid}: {ca} vs {cb}"
        return
    for x, y in zip(ca, cb):
        n = min(len(x.token_ids), len(y.token_ids))
        assert x.token_ids[:n] == y.token_ids[:n], f"aborted request {rid}: {x} vs {y}"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(program=programs,
       roomy_bs=st.sampled_from(BLOCK_SIZES), small_bs=st.sampled_from(BLOCK_SIZES),
       mode=st.sampled_from(["recompute", "swap"]), slack=st.integers(0, 2),
       seed=st.integers(0, 3))
def test_small_pool_gives_the_roomy_pools_outputs(micro_llama, program, roomy_bs, small_bs,
                                                  mode, slack, seed):
    preemptions = check_program(micro_llama, program, roomy_bs, small_bs, mode, slack, seed)
    target(float(preemptions), label="small-pool preemptions")   # steer towards preempting


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(program=programs,
       roomy_bs=st.sampled_from(BLOCK_SIZES), small_bs=st.sampled_from(BLOCK_SIZES),
       slack=st.integers(0, 2), seed=st.integers(0, 3), budget=st.sampled_from([1, 3, 8, 64]))
def test_v1_small_pool_and_budget_give_the_roomy_pools_outputs(micro_llama, program, roomy_bs,
                                                               small_bs, slack, seed, budget):
    """The same under vLLM v1's rules: the small engine also has a small token budget (chunked
    prefill) and preempts by recompute; beam requests are refused by v1 and so skipped."""
    preemptions = check_program(micro_llama, program, roomy_bs, small_bs, "recompute", slack,
                                seed, semantics="v1", budget=budget)
    target(float(preemptions), label="v1 small-pool preemptions")


def check_program(model: str, program: list, roomy_bs: int, small_bs: int, mode: str,
                  slack: int, seed: int, semantics: str = "v0", budget: int = 4096) -> int:
    """Run ``program`` on a roomy and a small engine in lockstep, assert everything above;
    returns how many times the small engine preempted. Under v1 both pools get one more block
    (block 0 is the null block) and only the small engine gets the small token budget."""
    reqs = [arg for op, arg in program if op == "add"]
    null = 1 if semantics == "v1" else 0
    if semantics == "v1":   # n children share nothing without prefix caching (the roomy run)
        roomy_need = sum(sp.width * cdiv(len(p) + sp.max_tokens - 1, roomy_bs)
                         for p, sp in reqs) + 2 + null
    else:   # v0 also decodes only with a free block per running sequence (vLLM v0's rule)
        roomy_need = sum(worst_case_blocks(len(p), sp, roomy_bs) + sp.width
                         for p, sp in reqs) + 2
    small_need = max((worst_case_blocks(len(p), sp, small_bs) for p, sp in reqs), default=1) + null
    common = dict(model=model, device="cpu", dtype="float32", seed=seed, semantics=semantics)
    roomy = Engine(EngineConfig(block_size=roomy_bs, num_gpu_blocks=roomy_need,
                                enable_prefix_caching=False, **common))
    small = Engine(EngineConfig(block_size=small_bs, num_gpu_blocks=small_need + slack,
                                enable_prefix_caching=True, preemption_mode=mode,
                                max_num_batched_tokens=budget,
                                num_cpu_blocks=small_need + 4 if mode == "swap" else 0, **common))
    engines = (roomy, small)
    preempts: tuple[list, list] = ([], [])
    added: list[str] = []
    beams: dict[str, bool] = {}
    aborted: set[str] = set()

    for op, arg in program:
        if op == "add":
            prompt, params = arg
            try:
                small.check_request(prompt, params)
            except ValueError:      # could never fit the small pool: skipped in both runs
                continue
            rid = str(len(added))
            for eng in engines:
                assert eng.add_request(prompt, params, request_id=rid) == rid
            added.append(rid)
            beams[rid] = params.use_beam_search
        elif op == "step":
            for _ in range(arg):
                for eng, pre in zip(engines, preempts):
                    if eng.has_unfinished_requests():
                        step_checked(eng, pre)
        else:                        # abort a request live in both runs (or nothing)
            live = [r for r in added
                    if not roomy.get_output(r).finished and not small.get_output(r).finished]
            if live:
                rid = live[arg % len(live)]
                for eng in engines:
                    eng.abort_request(rid)
                    eng.check_invariants()
                aborted.add(rid)

    for eng, pre in zip(engines, preempts):
        for _ in range(MAX_DRAIN_STEPS):
            if not eng.has_unfinished_requests():
                break
            step_checked(eng, pre)
        assert not eng.has_unfinished_requests(), "no progress"
        for pool in eng.bm.pools.values():      # v1 has no CPU pool
            assert pool.num_free == pool.num_usable, f"{pool.device} blocks leaked"
    assert not preempts[0], "the roomy pool preempted: it is not roomy"

    for rid in added:
        a, b = roomy.get_output(rid), small.get_output(rid)
        assert a.finished and b.finished
        if rid in aborted:
            if not beams[rid]:
                assert_prefix_consistent(a, b, rid)
            continue
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs], \
            f"request {rid}: outputs differ (small pool preempted {len(preempts[1])} times)"
        assert [c.finish_reason for c in a.outputs] == [c.finish_reason for c in b.outputs]
        for x, y in zip(a.outputs, b.outputs):
            assert math.isclose(x.cumulative_logprob, y.cumulative_logprob,
                                rel_tol=1e-4, abs_tol=1e-4), f"request {rid}: logprobs differ"
    return len(preempts[1])
