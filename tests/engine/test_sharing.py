"""Parallel sampling shares the prompt's blocks; beams fork and pruned beams free theirs."""
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import kinds, run_all

PROMPT20 = list(range(20, 40))


def test_parallel_sampling_fork_and_copy_on_write(tiny_llama):
    path, _ = tiny_llama
    eng = Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=32, seed=1))
    eng.add_request(PROMPT20, SamplingParams(n=4, temperature=1.0, max_tokens=20, ignore_eos=True))

    prefill = eng.step()
    assert prefill.kind == "prefill"
    assert kinds(prefill).count("fork") == 3
    snap = prefill.snapshot
    live = [s for s in snap.sequences if s.status == "running"]
    assert len(live) == 4
    full, partial = live[0].block_table
    assert all(s.block_table == (full, partial) for s in live)
    assert snap.blocks[full].ref_count == 4 and snap.blocks[full].filled == 16
    assert snap.blocks[partial].ref_count == 4 and snap.blocks[partial].filled == 4

    decode = eng.step()
    cows = [e for e in decode.events if e.kind == "cow"]
    assert len(cows) == 3                                 # the last sharer writes in place
    assert all(c.src == partial and c.logical == 1 for c in cows)
    kv = eng.runner.kv_cache
    for c in cows:   # real K/V bytes were copied: the 4 prompt slots equal the source's
        assert torch.equal(kv[:, :, c.dst, :4], kv[:, :, c.src, :4])
        assert kv[:, :, c.dst, :4].abs().sum() > 0
    snap = decode.snapshot
    assert snap.blocks[partial].ref_count == 1
    assert snap.blocks[full].ref_count == 4
    assert len({s.block_table[1] for s in snap.sequences}) == 4

    while eng.has_unfinished_requests():
        r = eng.step()
        eng.check_invariants()
        if eng.has_unfinished_requests():
            assert r.snapshot.blocks[full].ref_count == 4   # full blocks stay shared
    assert eng.snapshot.stats.used_blocks == 0
    texts = {tuple(o.token_ids) for o in eng.get_output("0").outputs}
    assert len(texts) > 1                                  # the samples really differ


def test_beam_search_frees_pruned_beams_in_the_same_step(tiny_llama):
    path, _ = tiny_llama
    eng = Engine(EngineConfig(model=path, block_size=2, num_gpu_blocks=64))
    eng.add_request(list(range(10, 15)), SamplingParams(beam_width=3, max_tokens=16,
                                                        ignore_eos=True))
    pruned_with_own_blocks = 0
    prev = eng.snapshot
    for result in run_all(eng):
        freed = {e.physical for e in result.events if e.kind == "free"}
        for e in result.events:
            if e.kind != "beam_prune":
                continue
            table = prev.seq(e.seq_id).block_table
            holders = {s.seq_id: s.block_table for s in prev.sequences if s.status == "running"}
            own = [b for b in table
                   if not any(b in t for sid, t in holders.items() if sid != e.seq_id)
                   and not any(c.kind == "fork" and b in c.physicals for c in result.events)]
            assert set(own) <= freed
            pruned_with_own_blocks += bool(own)
            assert result.snapshot.seq(e.seq_id).status == "pruned"
            assert result.snapshot.seq(e.seq_id).block_table == ()
        prev = result.snapshot
    assert pruned_with_own_blocks > 0
    assert eng.snapshot.stats.free_blocks == eng.snapshot.stats.total_blocks
    assert all(b.ref_count == 0 for b in eng.snapshot.blocks)
