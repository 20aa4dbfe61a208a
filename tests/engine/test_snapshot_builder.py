"""The one snapshot builder (engine/observe/snapshot.py) takes plain values: given the values
read off our engine, as real vLLM's snapshots (real_vllm/snapshots.py) read them off vLLM's
objects, it builds exactly the snapshot our recorder does. The contiguous baselines driven by
plain calls (as for real vLLM) match the ones the engine's observer hooks drive."""
from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.observe.observers import ContiguousBaselines
from engine.observe.snapshot import PoolContents, PrefixCacheCounts, SeqState, \
    SnapshotHistory, step_snapshot
from engine.processing.parallel_sampling import child_request_ids

CONFIGS = {
    "v0 swap": EngineConfig(block_size=4, num_gpu_blocks=24, semantics="v0",
                            preemption_mode="swap", num_cpu_blocks=16,
                            enable_prefix_caching=True, seed=2),
    "v1": EngineConfig(block_size=4, num_gpu_blocks=24, semantics="v1",
                       enable_prefix_caching=True, max_num_batched_tokens=24, seed=2),
}
REQUESTS = [
    (list(range(1, 14)), SamplingParams(max_tokens=12, ignore_eos=True)),
    (list(range(1, 10)) + [40, 41], SamplingParams(n=3, temperature=0.8, max_tokens=9,
                                                   ignore_eos=True)),
    ([7, 8, 9], SamplingParams(max_tokens=20)),
    (list(range(1, 14)) + [50], SamplingParams(max_tokens=6, ignore_eos=True)),
]


def plain_pool(pool) -> PoolContents:
    """A pool's values copied into plain lists (no versions: nothing reused)."""
    return PoolContents(pool.device, pool.block_size, list(pool.ref_count),
                        list(pool.block_hash), [tuple(t) for t in pool.tokens],
                        list(pool.free_queue), pool.num_usable, pool.null_block)


def plain_snapshot(eng: Engine, baselines: ContiguousBaselines, like):
    """The snapshot of ``eng`` built from plain values read off it, as a reader outside the
    engine would; ``like``: the recorded snapshot whose kind, events and index it takes."""
    seqs = []
    for g in eng.groups.values():
        for s in sorted(g.all_seqs(), key=lambda s: s.seq_id):
            seqs.append(SeqState(s.seq_id, s.request_id, s.parent_seq_id, s.born_step,
                                 s.status.value, tuple(s.token_ids), s.prompt_len,
                                 s.num_computed, tuple(s.block_table), s.block_device,
                                 s.output_text, s.cumulative_logprob, s.finish_reason,
                                 g.params.use_beam_search))
    q = eng.scheduler.queues()
    pc = eng.bm.prefix_cache_stats()
    cpu = eng.bm.pools.get("cpu")
    return step_snapshot(
        step=eng.step_no, kind=like.kind, index=like.index, model=eng.config.model,
        backend=eng.backend_label, device=eng.device, semantics=eng.config.semantics,
        sequences=tuple(seqs), gpu=plain_pool(eng.bm.gpu),
        cpu=plain_pool(cpu) if cpu is not None else None,
        queues=(len(q["waiting"]), len(q["running"]), len(q.get("swapped", ()))),
        logical_blocks=sum(len(s.block_table) for g in eng.groups.values() for s in g.seqs),
        bytes_per_block=eng.runner.bytes_per_block,
        prefix_cache=PrefixCacheCounts(pc.queries, pc.hits, pc.preempted_queries,
                                       pc.preempted_hits),
        num_preemptions=eng.scheduler.num_preemptions,
        running_seqs=eng.scheduler.num_running_seqs(), finished=eng.num_finished,
        baselines=baselines.accounting(), slabs=baselines.slabs(), events=like.events,
        step_time_s=like.step_time_s)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_builder_from_plain_values_equals_our_recorder(name):
    eng = Engine.length_only(CONFIGS[name], max_model_len=64, detailed_snapshots=True)
    shadow = ContiguousBaselines(eng.bm.gpu.num_usable * eng.config.block_size,
                                 eng.max_model_len)
    seen: set[str] = set()
    steps = kinds = 0
    for prompt, params in REQUESTS:
        eng.add_request(prompt, params)
        for rid, g in eng.groups.items():        # each request the engine runs (v1: children)
            if rid not in seen:
                seen.add(rid)
                shadow.add(rid, len(g.prompt_token_ids), g.params.max_tokens, g.params.width)
        assert plain_snapshot(eng, shadow, eng.snapshot) == eng.snapshot
    while eng.has_unfinished_requests():
        result = eng.step()
        for rid in result.finished:
            g = eng.groups[rid]
            shadow.finish(rid, max(len(s.output_token_ids) for s in g.done_seqs),
                          g.params.max_tokens)
        shadow.step()
        built = plain_snapshot(eng, shadow, result.snapshot)
        assert built == result.snapshot, result.snapshot.step
        assert built.to_dict() == result.snapshot.to_dict()
        steps += 1
        kinds |= bool(result.snapshot.stats.shared_blocks or
                      result.snapshot.stats.cpu_used_blocks)
    assert steps > 10 and kinds, "the run shares or swaps no block: it checks too little"
    assert [s.index for s in eng.history] == list(range(len(eng.history)))


def test_the_init_snapshot_is_renewed_only_before_the_first_step():
    h = SnapshotHistory(max_history=10)
    eng = Engine.length_only(CONFIGS["v1"], max_model_len=64, detailed_snapshots=True)
    h.keep(eng.snapshot)
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    h.renew_init(lambda: h.keep(eng.snapshot))
    assert len(h.history) == 1 and h.recorded == 1 and h.snapshot.stats.num_waiting == 1
    assert h.accounting_log == []                      # init is not a step
    h.keep(eng.step().snapshot)
    h.renew_init(lambda: pytest.fail("renewed after a step"))
    assert h.recorded == 2 and [s.kind for s in h.history] == ["init", "prefill"]
    assert len(h.accounting_log) == 1


def test_child_request_ids_name_vllms_children():
    assert child_request_ids("r", 3) == ["0_r", "1_r", "2_r"]
    assert child_request_ids("r", 1) == []


def test_viewing_our_engine_changes_nothing():
    """real_vllm/ours.py's viewer, like the adapter: ``drain()`` takes the step's KV event
    batches, ``view()`` only reads (two views are equal), and a second drain finds nothing."""
    from real_vllm.ours import OurStepViewer
    eng = Engine.length_only(CONFIGS["v1"], max_model_len=128)
    viewer = OurStepViewer(eng)
    prompt, params = REQUESTS[0]
    eng.add_request(prompt, params)
    result = eng.step()
    assert viewer.drain(), "the prefill stored no block"
    first, again = viewer.view(result), viewer.view(result)
    assert first == again and first.kv_events and first.scheduled
    assert viewer.drain() == [] and viewer.view(result).kv_events == []
    viewer.detach()
    eng.close()
