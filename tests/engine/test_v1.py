"""vLLM v1 semantics: chunked prefill under a token budget, sharing only through the prefix
cache, recompute-only preemption of the latest admitted request, the null block, the free
queue's order (cases written after vLLM's tests/v1/core/test_prefix_caching.py and
test_scheduler.py, with our own code)."""
import dataclasses

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.core.hashing import hash_block
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.sequence import Sequence
from tests.engine.helpers import hf_greedy, kinds, run_all

LONG_PROMPTS = [list(range(10, 60)), list(range(3, 100, 2)), [7, 8, 9]]     # 50, 49, 3 tokens


def v1(**kw) -> EngineConfig:
    return EngineConfig(semantics="v1", **kw)


def events(results, kind):
    return [e for r in results for e in r.events if e.kind == kind]


# ---- chunked prefill ---------------------------------------------------------------------
@pytest.mark.parametrize("budget", [1, 7, 16, 64])
def test_chunked_prefill_keeps_greedy_outputs(tiny_llama, budget):
    path, hf = tiny_llama
    expected = [hf_greedy(hf, p, 12) for p in LONG_PROMPTS]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    v0 = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=96))
    v0_out = [o.outputs[0].token_ids for o in v0.generate(LONG_PROMPTS, params)]
    eng = Engine(v1(model=path, block_size=4, num_gpu_blocks=96, max_num_batched_tokens=budget))
    for p in LONG_PROMPTS:
        eng.add_request(p, params)
    results = run_all(eng)
    got = [eng.get_output(r).outputs[0].token_ids for r in ("0", "1", "2")]
    assert got == expected == v0_out
    for r in results:                      # tokens computed in a step never exceed the budget
        computed = sum(e.end - e.start for e in r.events if e.kind == "prefill")
        assert computed + len([e for e in r.events if e.kind == "append"]) <= budget
    if budget < 50:                        # the 50-token prompt really was split
        chunks = [e for e in events(results, "prefill") if e.seq_id == 0]
        assert len(chunks) > 1 and chunks[-1].end == 50 and chunks[0].total == 50


def test_a_100_token_prompt_with_a_32_token_budget_takes_four_chunks():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=32))
    eng.add_request([4 + i % 50 for i in range(100)], SamplingParams(max_tokens=3, ignore_eos=True))
    results = [eng.step() for _ in range(4)]
    chunks = [(e.start, e.end, e.total) for r in results for e in r.events if e.kind == "prefill"]
    assert chunks == [(0, 32, 100), (32, 64, 100), (64, 96, 100), (96, 100, 100)]
    # a request samples only once its whole prompt is computed
    assert [len([e for e in r.events if e.kind == "sample"]) for r in results] == [0, 0, 0, 1]
    assert [r.kind for r in results] == ["prefill"] * 4


def test_long_prefill_token_threshold_caps_one_requests_chunk():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=64,
                                long_prefill_token_threshold=10))
    eng.add_request(list(range(4, 29)), SamplingParams(max_tokens=2, ignore_eos=True))   # 25 tokens
    eng.add_request(list(range(30, 42)), SamplingParams(max_tokens=2, ignore_eos=True))  # 12 tokens
    first = eng.step()
    assert [(e.seq_id, e.start, e.end) for e in first.events if e.kind == "prefill"] == \
        [(0, 0, 10), (1, 0, 10)]


def test_a_lone_request_is_not_capped_by_the_long_prefill_threshold():
    """vLLM 0.32 Scheduler.schedule drops long_prefill_token_threshold when only one request
    is running or waiting (nobody to starve): an 80-token prompt, budget 64, threshold 32 is
    computed as 64 + 16, not 32 + 32 + 16. A second request brings the cap back."""
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=80, max_num_batched_tokens=64,
                                long_prefill_token_threshold=32))
    eng.add_request([4 + i % 50 for i in range(80)], SamplingParams(max_tokens=9, ignore_eos=True))
    results = [eng.step(), eng.step()]
    assert [(e.start, e.end) for e in events(results, "prefill")] == [(0, 64), (64, 80)]
    eng.add_request([6 + i % 45 for i in range(80)], SamplingParams(max_tokens=2, ignore_eos=True))
    eng.add_request([5 + i % 40 for i in range(80)], SamplingParams(max_tokens=2, ignore_eos=True))
    step = eng.step()
    assert [(e.seq_id, e.end - e.start) for e in step.events if e.kind == "prefill"] == \
        [(1, 32), (2, 31)]        # request 0 decodes one token of the 64


def test_a_waiting_request_is_admitted_only_if_its_whole_prompt_fits():
    """vLLM's scheduler_reserve_full_isl (full_sequence_must_fit in allocate_slots): 6 blocks of
    32 (5 usable), budget 80, prompts of 64 and 100 tokens: the second needs 4 blocks but only 3
    are left, so it waits even though its first 16-token chunk would fit."""
    eng = Engine.length_only(v1(block_size=32, num_gpu_blocks=6, max_num_batched_tokens=80))
    eng.add_request([4 + i % 50 for i in range(64)], SamplingParams(max_tokens=30, ignore_eos=True))
    eng.add_request([5 + i % 40 for i in range(100)], SamplingParams(max_tokens=2, ignore_eos=True))
    first = eng.step()
    assert [(e.seq_id, e.start, e.end) for e in first.events if e.kind == "prefill"] == [(0, 0, 64)]
    assert not [e for e in first.events if e.kind == "preempt"]
    results = run_all(eng)
    assert not events(results, "preempt")
    assert all(eng.get_output(r).finished for r in ("0", "1"))


def test_a_parents_num_cached_tokens_is_the_last_finishing_childs():
    """vLLM builds an n > 1 request's output from the child whose finish completes it
    (ParentRequest.get_outputs), so num_cached_tokens is that child's: child 0 computes the
    prompt (0 cached), the others find its full blocks."""
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=8))
    rid = eng.add_request(list(range(4, 16)), SamplingParams(n=3, temperature=1.0, seed=1,
                                                             max_tokens=3, ignore_eos=True))
    run_all(eng)
    cached = [eng.groups[c].num_cached_tokens for c in eng.children[rid]]
    last = max(eng.children[rid], key=lambda c: eng.groups[c].finish_order)
    assert cached[0] == 0 and eng.groups[last].num_cached_tokens == 8
    assert eng.get_output(rid).num_cached_tokens == 8


def test_a_step_mixes_a_decode_token_and_a_prefill_chunk():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=40, max_num_batched_tokens=8))
    eng.add_request([5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True))
    eng.step()                                       # request 0: its prompt, first token
    eng.add_request(list(range(10, 30)), SamplingParams(max_tokens=2, ignore_eos=True))
    step = eng.step()
    assert step.kind == "mixed"
    assert [(e.seq_id, e.logical) for e in step.events if e.kind == "append"] == [(0, 0)]
    assert [(e.seq_id, e.start, e.end) for e in step.events if e.kind == "prefill"] == [(1, 0, 7)]
    assert [e.seq_id for e in step.events if e.kind == "sample"] == [0]      # 1 is mid-prompt
    eng.check_invariants()


# ---- parallel sampling -------------------------------------------------------------------
def test_parallel_sampling_shares_the_prompt_through_the_prefix_cache(tiny_llama):
    path, _ = tiny_llama
    prompt = list(range(10, 31))                           # 21 tokens: 5 full blocks of 4
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=11)

    def run():
        eng = Engine(v1(model=path, block_size=4, num_gpu_blocks=64))
        rid = eng.add_request(prompt, params)
        first = eng.step()
        results = [first] + run_all(eng)
        return eng, rid, first, results

    eng, rid, first, results = run()
    assert not events(results, "cow") and not events(results, "fork")
    assert eng.request_ids(rid) == ["0_0", "1_0", "2_0", "3_0"]
    prompt_blocks = [s.block_table[:5] for s in first.snapshot.sequences]
    assert all(t == prompt_blocks[0] for t in prompt_blocks)
    refs = {b.block_id: b.ref_count for b in first.snapshot.blocks}
    assert [refs[b] for b in prompt_blocks[0]] == [4] * 5
    hits = [e for e in first.events if e.kind == "prefix_hit"]
    assert sorted({e.seq_id for e in hits}) == [1, 2, 3] and len(hits) == 15
    out = eng.get_output(rid)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and out.finished
    again = run()[0].get_output(rid)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    # child i is the n = 1 request seeded seed + i (vLLM v1 engine/parallel_sampling.py)
    single = Engine(v1(model=path, block_size=4, num_gpu_blocks=64))
    alone = single.generate([prompt], SamplingParams(temperature=1.0, max_tokens=6, seed=13))[0]
    assert alone.outputs[0].token_ids == out.outputs[2].token_ids


def test_beam_search_is_refused_in_v1_with_the_reason():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32))
    before = eng.snapshot.to_dict()
    with pytest.raises(ValueError, match="beam search is not part of vLLM v1's engine core"):
        eng.add_request([5, 6, 7], SamplingParams(beam_width=2, max_tokens=4))
    assert eng.snapshot.to_dict() == before and not eng.has_unfinished_requests()


# ---- preemption --------------------------------------------------------------------------
def test_preemption_is_recompute_of_the_latest_admitted_and_keeps_outputs(tiny_llama):
    path, _ = tiny_llama
    prompts = [list(range(10, 20)), list(range(30, 38)), list(range(50, 59))]
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    roomy = Engine(v1(model=path, block_size=4, num_gpu_blocks=64))
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    small = Engine(v1(model=path, block_size=4, num_gpu_blocks=13, enable_prefix_caching=False))
    for p in prompts:
        small.add_request(p, params)
    results = run_all(small)
    preempts = events(results, "preempt")
    assert preempts and all(e.mode == "recompute" and "most recently admitted" in e.rule
                            for e in preempts)
    assert not events(results, "swap_out")
    running: list[int] = []              # admission order, replayed from the events
    for r in results:
        for e in r.events:
            if e.kind == "prefill" and e.start == 0:          # admitted (again)
                running.append(e.seq_id)
            elif e.kind == "preempt":
                assert e.seq_id == running[-1], "the victim is the latest admitted"
                running.remove(e.seq_id)
            elif e.kind == "finish":
                running.remove(e.seq_id)
        if any(e.kind == "preempt" for e in r.events):     # and nothing is admitted then
            assert not [e for e in r.events if e.kind == "prefill" and e.start == 0]
    got = [small.get_output(r).outputs[0].token_ids for r in ("0", "1", "2")]
    assert got == expected
    assert small.snapshot.stats.num_preemptions == len(preempts)


def test_swap_with_v1_is_refused_naming_the_reason():
    with pytest.raises(ValueError, match="v1 has no swap"):
        EngineConfig(semantics="v1", preemption_mode="swap", num_cpu_blocks=8)
    with pytest.raises(ValueError, match="semantics must be 'v0' or 'v1'"):
        EngineConfig(semantics="v2")


# ---- the block pool ----------------------------------------------------------------------
def _seq(seq_id: int, tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(seq_id, str(seq_id), list(tokens), len(tokens), cache_salt=salt)


def test_eviction_order_matches_vllm_test_evict():
    """As vLLM's current test_prefix_caching.py::test_evict: 11 blocks of 16 (block 0 null).
    A freed block without a hash (r0's partial block 6) goes to the front, to be reused first;
    cached ones to the back, each request's last block first (BlockPool.free_blocks)."""
    kv = KVCacheManager(11, 16, True, lambda e: None)
    r0 = _seq(0, list(range(5 * 16 + 7)))                  # 5 full blocks + 7 tokens
    assert kv.get_computed_blocks(r0) == []
    assert kv.allocate_slots(r0, 5 * 16 + 7)
    assert r0.block_table == [1, 2, 3, 4, 5, 6]
    r1 = _seq(1, list(range(87, 87 + 3 * 16)))
    assert kv.allocate_slots(r1, 3 * 16) and r1.block_table == [7, 8, 9]
    assert kv.gpu.num_free == 1
    kv.free(r0)
    kv.free(r1)
    assert list(kv.gpu.free_queue) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    # touch the first two blocks: a hit on free cached blocks takes them off the free queue
    r2 = _seq(2, list(range(2 * 16 + 3)))
    hits = kv.get_computed_blocks(r2)
    assert hits == [1, 2]
    assert kv.allocate_slots(r2, 3, hits)
    assert r2.block_table == [1, 2, 6] and r2.num_computed == 2 * 16
    assert kv.gpu.num_free == 7 and 1 not in kv.gpu.free_queue and 2 not in kv.gpu.free_queue


def test_freed_blocks_without_a_hash_are_reused_first():
    """As vLLM's current test_prefix_caching.py::test_prefill (PR #42656): two requests share
    three cached blocks and end in a partial block each; once both are freed the two partial
    blocks (5 then 4, the last freed first) lead the free queue, the cached ones close it
    (each request's last block first), and a new request reuses block 5 before any fresh one."""
    kv = KVCacheManager(11, 16, True, lambda e: None)
    common = [i for i in range(3) for _ in range(16)]
    r0 = _seq(0, common + [3] * 7)
    assert kv.allocate_slots(r0, 55) and r0.block_table == [1, 2, 3, 4]
    r1 = _seq(1, common + [3] * 5)
    hits = kv.get_computed_blocks(r1)
    assert hits == [1, 2, 3] and kv.allocate_slots(r1, 53 - 48, hits)
    assert r1.block_table == [1, 2, 3, 5]
    kv.free(r0)
    kv.free(r1)
    assert list(kv.gpu.free_queue) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    r2 = _seq(2, common + [3] * 6)
    hits = kv.get_computed_blocks(r2)
    assert kv.allocate_slots(r2, 54 - 48, hits) and r2.block_table == [1, 2, 3, 5]
    kv.free(r2)
    r3 = _seq(3, [99] * 160)                                 # takes every block: eviction order
    assert kv.allocate_slots(r3, 160) and r3.block_table == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]


def test_without_prefix_caching_the_last_freed_block_is_reused_first():
    """No block has a hash, so every freed block goes to the front (vLLM PR #51482 restored
    this after #48017 had appended them): a new request gets the freed request's blocks back,
    its last block first."""
    kv = KVCacheManager(11, 4, False, lambda e: None)
    r0 = _seq(0, list(range(10)))
    assert kv.allocate_slots(r0, 10) and r0.block_table == [1, 2, 3]
    kv.free(r0)
    assert list(kv.gpu.free_queue)[:3] == [3, 2, 1]
    r1 = _seq(1, list(range(20, 28)))
    assert kv.allocate_slots(r1, 8) and r1.block_table == [3, 2]


def test_a_cached_block_is_evicted_only_when_reallocated():
    seen = []
    kv = KVCacheManager(4, 4, True, seen.append)
    r0 = _seq(0, [1, 2, 3, 4, 5])
    kv.allocate_slots(r0, 5)
    kv.free(r0)
    assert kv.gpu.block_hash[1] is not None and not [e for e in seen if e.kind == "evict"]
    r1 = _seq(1, [9, 9, 9, 9, 9, 9, 9, 9, 9])           # needs all 3 usable blocks
    kv.allocate_slots(r1, 9)
    assert [e.physical for e in seen if e.kind == "evict"] == [1]


def test_a_prefix_hit_never_covers_the_last_prompt_token():
    kv = KVCacheManager(16, 4, True, lambda e: None)
    r0 = _seq(0, list(range(8)))                          # exactly two full blocks
    kv.allocate_slots(r0, 8)
    same = _seq(1, list(range(8)))
    assert len(kv.get_computed_blocks(same)) == 1         # the last block is recomputed
    longer = _seq(2, list(range(9)))
    assert len(kv.get_computed_blocks(longer)) == 2


def test_different_cache_salts_never_share_a_block():
    kv = KVCacheManager(32, 4, True, lambda e: None)
    a = _seq(0, list(range(12)), salt="alice")
    kv.allocate_slots(a, 12)
    assert kv.get_computed_blocks(_seq(1, list(range(13)), salt="bob")) == []
    assert kv.get_computed_blocks(_seq(2, list(range(13)))) == []
    assert kv.get_computed_blocks(_seq(3, list(range(13)), salt="alice")) == a.block_table
    # the salt is an extra key of the first block only; the chain carries it on
    assert a.block_hashes[0] == hash_block("", list(range(4)), (("cache_salt", "alice"),))
    assert a.block_hashes[1] == hash_block(a.block_hashes[0], list(range(4, 8)))


def test_cache_salt_through_the_engine():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32))
    prompt = list(range(4, 17))
    eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True), cache_salt="a")
    eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True), cache_salt="b")
    eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True), cache_salt="a")
    results = run_all(eng)
    assert sorted({e.seq_id for e in events(results, "prefix_hit")}) == [2]
    with pytest.raises(ValueError, match="cache_salt"):
        eng.add_request(prompt, SamplingParams(), cache_salt="")


def test_the_null_block_is_never_handed_out():
    eng = Engine.length_only(v1(block_size=2, num_gpu_blocks=6), detailed_snapshots=True)
    for i in range(3):
        eng.add_request([4 + i, 5, 6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
    while eng.has_unfinished_requests():
        snap = eng.step().snapshot
        eng.check_invariants()
        assert 0 not in eng.bm.gpu.free_queue
        assert all(0 not in s.block_table for s in snap.sequences)
        assert snap.blocks[0].state == "null" and snap.stats.null_blocks == 1
    assert eng.bm.gpu.num_free == 5


def test_usage_and_prefix_cache_metrics_follow_vllm():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=11))
    prompt = list(range(4, 14))                                   # 10 tokens: 2 full blocks
    eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    first = eng.step().snapshot
    # the request finished at its first sample: its blocks are free again (2 of them cached)
    assert first.stats.kv_cache_usage_perc == 0.0
    assert first.stats.prefix_cache_queries == 10 and first.stats.prefix_cache_hits == 0
    eng.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    second = eng.step().snapshot
    assert second.stats.prefix_cache_queries == 20 and second.stats.prefix_cache_hits == 8
    assert second.stats.kv_cache_usage_perc == pytest.approx(3 / 10)  # 3 used of 10 usable


def test_lookups_by_preempted_requests_are_counted_apart_as_vllm_does():
    """vLLM's PrefixCacheStats.record(num_tokens, num_hits, preempted) (vllm/v1/metrics/
    stats.py): a request preempted before re-finds its own blocks; those lookups go to
    preempted_queries / preempted_hits, and vllm:prefix_cache_queries / _hits keep the rest."""
    # 8 blocks: the preempted request is admitted again while some of its blocks are cached
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=8))
    lookups, preempted, step_lookups = [], set(), []
    lookup = eng.bm.get_computed_blocks

    def recording(seq):                  # every lookup, as vLLM's record() would see it
        hits = lookup(seq)
        step_lookups.append((seq, (seq.num_tokens, len(hits) * 4, seq.seq_id in preempted)))
        return hits
    eng.bm.get_computed_blocks = recording
    for p in ([*range(10, 20)], [*range(30, 38)], [*range(50, 59)]):
        eng.add_request(p, SamplingParams(max_tokens=14, ignore_eos=True))
    while eng.has_unfinished_requests():
        step_lookups.clear()
        preempted |= {e.seq_id for e in eng.step().events if e.kind == "preempt"}
        waiting = {g.seqs[0].seq_id for g in eng.scheduler.waiting}
        # counted at admission: a lookup whose request stayed waiting is not counted
        lookups += [rec for seq, rec in step_lookups if seq.seq_id not in waiting]
    st = eng.snapshot.stats
    assert st.num_preemptions >= 1 and any(p for _, _, p in lookups)
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (
        sum(n for n, _, p in lookups if not p), sum(h for _, h, p in lookups if not p))
    assert (st.prefix_cache_preempted_queries, st.prefix_cache_preempted_hits) == (
        sum(n for n, _, p in lookups if p), sum(h for _, h, p in lookups if p))
    assert st.prefix_cache_preempted_hits > 0 == st.prefix_cache_hits     # its own blocks


def test_more_children_than_max_num_seqs_queue_in_v1_and_are_refused_in_v0():
    """v1's n > 1 is n child requests scheduled one by one (vLLM's ParentRequest,
    vllm/v1/engine/parallel_sampling.py), so n may exceed max_num_seqs: the rest wait. v0
    schedules a group whole, so such a group could never run and is refused."""
    sp = SamplingParams(n=4, max_tokens=3, ignore_eos=True, temperature=1.0, seed=2)
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32, max_num_seqs=2))
    eng.add_request([5, 6, 7], sp)
    most = 0
    while eng.has_unfinished_requests():
        eng.step()
        most = max(most, eng.scheduler.num_running_seqs())
    assert most == 2 and len(eng.get_output("0").outputs) == 4
    v0 = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=32, max_num_seqs=2))
    with pytest.raises(ValueError, match="n/beam_width 4 exceeds max_num_seqs 2"):
        v0.add_request([5, 6, 7], sp)


def test_unseeded_children_draw_apart_from_the_next_requests():
    """Without a seed, vLLM's v1 children sample independently; their default seeds here must
    not be the next requests' (child 1 of request 0 once had request 1's seed)."""
    eng = Engine(v1(model="default", block_size=8, num_gpu_blocks=64))
    sp = SamplingParams(n=2, max_tokens=12, ignore_eos=True, temperature=1.0)
    first, second = (eng.add_request("ROMEO:", sp) for _ in range(2))
    run_all(eng)
    ids = [[o.token_ids for o in eng.get_output(r).outputs] for r in (first, second)]
    assert len({tuple(t) for pair in ids for t in pair}) == 4, ids
    # a given seed: child i is seeded seed + i, as vLLM's parallel_sampling.py does
    eng.add_request("ROMEO:", dataclasses.replace(sp, seed=7), request_id="s")
    assert [eng.groups[c].params.seed for c in eng.children["s"]] == [7, 8]


def test_a_lookup_is_counted_once_when_its_request_is_admitted():
    """vLLM's Scheduler.schedule records prefix-cache stats after allocate_slots succeeded
    ("Record at admission so unscheduled lookups are not counted", vllm/v1/core/sched/
    scheduler.py): a waiting head refused blocks step after step is counted once."""
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=5))
    eng.add_request(list(range(10, 23)), SamplingParams(max_tokens=4, ignore_eos=True))
    eng.add_request(list(range(30, 34)), SamplingParams(max_tokens=2, ignore_eos=True))
    lookups, lookup = [], eng.bm.get_computed_blocks
    eng.bm.get_computed_blocks = lambda seq: lookups.append(seq.seq_id) or lookup(seq)
    while eng.has_unfinished_requests():
        eng.step()
    assert lookups.count(1) > 1                      # the second one waited for blocks
    assert eng.snapshot.stats.prefix_cache_queries == 13 + 4


def test_v0_default_is_unchanged_and_v1_caches_by_default():
    assert EngineConfig().semantics == "v0" and not EngineConfig().prefix_caching
    assert EngineConfig(semantics="v1").prefix_caching
    assert not EngineConfig(semantics="v1", enable_prefix_caching=False).prefix_caching


def test_kinds_helper_sees_v1_events():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=16))
    eng.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=2, ignore_eos=True))
    assert kinds(eng.step()) == ["alloc", "alloc", "cached", "prefill", "sample"]


def test_a_child_id_never_takes_a_parents_id():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32))
    sp = SamplingParams(n=2, max_tokens=3, ignore_eos=True, temperature=1.0, seed=1)
    eng.add_request([5, 6, 7], sp, request_id="0_a")
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request([8, 9, 10], sp, request_id="a")          # its child "0_a" is a parent
    assert eng.get_output("0_a").prompt_token_ids == [5, 6, 7]


def test_aborting_a_parent_aborts_its_children_in_the_baselines_too():
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32))
    rid = eng.add_request([5, 6, 7, 8, 9], SamplingParams(n=3, max_tokens=8, ignore_eos=True,
                                                          temperature=1.0))
    eng.step()
    eng.step()
    assert eng.get_num_unfinished_requests() == 3          # the children count one each
    eng.abort_request(rid)
    assert not eng.has_unfinished_requests() and eng.get_output(rid).finished
    assert eng.get_num_unfinished_requests() == 0
    assert all(not a.has_unfinished() for a in eng.baselines.allocators.values())
    eng.check_invariants()


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_abort_request_takes_a_list_and_checks_every_id_first(semantics):
    """vLLM's abort_request(request_id: str | Iterable[str]); an unknown id among them aborts
    none (bad input changes nothing)."""
    eng = Engine.length_only(EngineConfig(semantics=semantics, block_size=4, num_gpu_blocks=32))
    a, b, c = (eng.add_request([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
               for _ in range(3))
    eng.step()
    assert eng.get_num_unfinished_requests() == 3
    with pytest.raises(ValueError, match="unknown request id 'nope'"):
        eng.abort_request([a, "nope"])
    for bad, words in ((5, "an id or a list of ids, got int"), ([a, 7], "a request id is a string")):
        with pytest.raises(ValueError, match=words):
            eng.abort_request(bad)
    assert eng.get_num_unfinished_requests() == 3
    eng.abort_request([a, b])
    assert eng.get_num_unfinished_requests() == 1 and not eng.is_finished(c)
    assert [eng.get_output(r).outputs[0].finish_reason for r in (a, b)] == ["abort", "abort"]
    history = len(eng.history)
    eng.abort_request(a)                                    # finished already: nothing happens
    assert len(eng.history) == history
    eng.check_invariants()


def test_reset_with_running_requests_preempts_them_and_keeps_outputs(tiny_llama):
    """vLLM's reset_prefix_cache(reset_running_requests=True) (vllm/v1/core/sched/scheduler.py;
    vLLM's end-to-end test resets mid-run and expects the same outputs): refused without it while
    blocks are in use; with it every running request is preempted by recompute, newest first,
    the cache is emptied, and the requests resume in admission order with unchanged outputs."""
    path, _ = tiny_llama
    prompts = [list(range(10, 30)), list(range(10, 26)) + [7, 7], [5, 6, 7, 8, 9]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    def run(reset_at: int | None):
        eng = Engine(v1(model=path, block_size=4, num_gpu_blocks=64))
        for p in prompts:
            eng.add_request(p, params)
        reset = None
        while eng.has_unfinished_requests():
            if eng.step_no == reset_at:
                running = [g.seqs[0].seq_id for g in eng.scheduler.running]
                assert len(running) == 3 and not eng.reset_prefix_cache()    # blocks in use
                assert eng.reset_prefix_cache(reset_running_requests=True)
                reset = (running, eng.snapshot)
                eng.check_invariants()
            eng.step()
        outs = [eng.get_output(r).outputs[0].token_ids for r in ("0", "1", "2")]
        return outs, reset, eng
    expected, _, _ = run(None)
    got, (running, snap), eng = run(5)
    assert got == expected
    assert snap.kind == "reset" and snap.stats.used_blocks == 0
    kinds_seen = [e.kind for e in snap.events]
    assert [e.seq_id for e in snap.events if e.kind == "preempt"] == running[::-1]
    assert kinds_seen[-1] == "cache_reset" and snap.stats.num_preemptions == 3
    assert all(b.block_hash is None for b in snap.blocks)
    assert eng.snapshot.stats.prefix_cache_preempted_queries > 0      # they looked up again
    v0 = Engine.length_only(EngineConfig(block_size=4))
    with pytest.raises(ValueError, match="vLLM v1's"):
        v0.reset_prefix_cache(True)
    with pytest.raises(ValueError, match="vLLM v1's"):      # its scheduler refuses it too
        v0.scheduler.preempt_all_running()
    with pytest.raises(ValueError, match="True or False"):
        eng.reset_prefix_cache("yes")


def test_a_prefix_cache_reset_does_not_step_the_baselines():
    def accounting(reset: bool):
        eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=32))
        eng.add_request(list(range(4, 14)), SamplingParams(max_tokens=4, ignore_eos=True))
        if reset:
            assert eng.reset_prefix_cache()
        eng.step()
        return [(a.allocator, a.token_states, a.running) for a in eng.snapshot.accounting]
    assert accounting(True) == accounting(False)


def test_a_recomputed_block_is_cached_again_as_a_copy():
    """vLLM v1 does not de-duplicate the prefix cache (block_pool.py, BlockHashToBlockMap;
    test_prefix_caching.py::test_prefill_plp: "Duplicate cached blocks have different ids but
    same hashes"). The same 8-token prompt twice (block size 4): the second hits block 1 only
    (a hit never covers the last prompt token), recomputes its second block into block 3, and
    block 3 is cached under the same hash, announced by its own KV event. Once block 2 is
    evicted, block 3 serves the hash: a later prompt still hits 8 tokens."""
    seen = []
    eng = Engine.length_only(v1(block_size=4, num_gpu_blocks=6), vocab_size=1000)
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def run(prompt):
        eng.add_request(prompt, one)
        while eng.has_unfinished_requests():
            seen.extend(eng.step().events)

    run(list(range(8)))
    run(list(range(8)))
    gpu = eng.bm.gpu
    h = gpu.block_hash[2]
    assert gpu.block_hash[3] == h and gpu.cached[h] == 2 and gpu.copies == {h: [3]}
    assert [e.physical for e in seen if e.kind == "cached" and e.block_hash == h] == [2, 3]
    eng.check_invariants()
    run(list(range(100, 112)))                    # three fresh blocks: block 2 is evicted
    assert [e.physical for e in seen if e.kind == "evict"] == [2]
    assert gpu.cached[h] == 3 and not gpu.copies
    hits = eng.bm.prefix_cache_hits
    run(list(range(8)) + [50])
    assert eng.bm.prefix_cache_hits - hits == 8
    eng.check_invariants()
