"""Observers: snapshots, history and baselines watch the engine; without them (observe=False,
generate()) the engine runs the same and records nothing. Abort snapshots get their own index."""
from engine import Engine, EngineConfig, SamplingParams

PROMPTS = [[3, 4, 5, 6, 7], [9, 8, 7]]


def _run(eng):
    rids = [eng.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in PROMPTS]
    rids.append(eng.add_request([2, 3], SamplingParams(n=2, temperature=1.0, seed=9, max_tokens=5,
                                                       ignore_eos=True)))
    results = []
    while eng.has_unfinished_requests():
        results.append(eng.step())
    return results, [[o.token_ids for o in eng.get_output(r).outputs] for r in rids]


def test_observe_false_runs_the_same_and_records_nothing(tiny_llama):
    watched = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64))
    plain = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64,
                                observe=False))
    w_results, w_out = _run(watched)
    p_results, p_out = _run(plain)
    assert p_out == w_out
    assert [r.events for r in p_results] == [r.events for r in w_results]   # same engine work
    assert all(r.snapshot is None for r in p_results) and plain.snapshot is None
    assert len(plain.history) == 0 and plain.accounting_log == [] and plain.observers == []
    assert all(r.snapshot is not None for r in w_results)
    assert len(watched.history) == len(w_results) + 1                      # + the init snapshot
    assert [s.index for s in watched.history] == list(range(len(watched.history)))


def test_generate_records_no_snapshots(tiny_llama):
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64))
    before = len(eng.history)
    out = eng.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert len(eng.history) == before and eng.accounting_log == []
    plain = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64, observe=False))
    again = plain.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in again]
    eng.add_request([1, 2], SamplingParams(max_tokens=2))   # observers are back afterwards
    eng.step()
    assert len(eng.history) == before + 1


def test_abort_gets_its_own_history_entry(tiny_llama):
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64))
    a = eng.add_request(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True))
    eng.add_request(PROMPTS[1], SamplingParams(max_tokens=6, ignore_eos=True))
    eng.step()
    eng.abort_request(a)
    eng.step()
    snaps = list(eng.history)
    assert [s.kind for s in snaps] == ["init", "prefill", "abort", "decode"]
    assert [s.step for s in snaps] == [0, 1, 1, 2]            # the abort happened after step 1
    assert [s.index for s in snaps] == [0, 1, 2, 3]           # but it is its own entry
    assert {e.kind for e in snaps[2].events} == {"free", "finish"}
    from engine.observe.snapshot import StepSnapshot
    assert StepSnapshot.from_dict(snaps[2].to_dict()).index == 2   # survives a saved trace
