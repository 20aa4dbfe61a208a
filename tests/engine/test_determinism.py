"""Same seeds, same requests: identical event streams and outputs."""
from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all


def trace(path):
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=20, seed=7,
                              preemption_mode="swap", num_cpu_blocks=20))
    eng.add_request(list(range(3, 12)), SamplingParams(n=3, temperature=0.9, top_p=0.9,
                                                       max_tokens=12, ignore_eos=True))
    eng.add_request(list(range(20, 26)), SamplingParams(beam_width=2, max_tokens=10,
                                                        ignore_eos=True))
    eng.add_request(list(range(30, 34)), SamplingParams(temperature=1.2, top_k=5, max_tokens=14,
                                                        ignore_eos=True))
    results = run_all(eng)
    return [[e.to_dict() for e in r.events] for r in results], [s.to_dict() for s in eng.history]


def test_two_runs_give_identical_event_streams(tiny_llama):
    events_a, snaps_a = trace(tiny_llama[0])
    events_b, snaps_b = trace(tiny_llama[0])
    assert events_a == events_b
    for a, b in zip(snaps_a, snaps_b):
        a.pop("step_time_s"), b.pop("step_time_s")
        assert a == b
    kinds = {e["kind"] for step in events_a for e in step}
    assert {"fork", "cow", "sample", "alloc", "free"} <= kinds


def test_snapshots_round_trip_through_json(tiny_llama):
    import json

    from engine import StepSnapshot
    _, snaps = trace(tiny_llama[0])
    for d in snaps:
        back = StepSnapshot.from_dict(json.loads(json.dumps(d)))
        assert back.to_dict() == d


def test_cached_snapshot_parts_equal_a_fresh_build(tiny_llama):
    """Snapshots reuse unchanged blocks and finished sequences; they must never go stale."""
    from engine.observe.observers import build_snapshot

    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=20, seed=3,
                              preemption_mode="swap", num_cpu_blocks=20,
                              enable_prefix_caching=True))
    eng.add_request(list(range(3, 12)), SamplingParams(n=3, temperature=0.9, max_tokens=12,
                                                       ignore_eos=True))
    eng.add_request(list(range(3, 10)), SamplingParams(beam_width=2, max_tokens=10))
    eng.add_request(list(range(30, 34)), SamplingParams(max_tokens=14, ignore_eos=True))
    while eng.has_unfinished_requests():
        snap = eng.step().snapshot
        fresh = build_snapshot(step=snap.step, kind=snap.kind, groups=list(eng.groups.values()),
                               bm=eng.bm, queues=(0, 0, 0), events=(), step_time_s=0.0,
                               model="", backend="", device="cpu", bytes_per_block=0,
                               running_seqs=0, finished=0, baselines=())
        assert snap.blocks == fresh.blocks and snap.cpu_blocks == fresh.cpu_blocks
        assert snap.sequences == fresh.sequences
