"""Admission: the exact worst-case bound, max_num_seqs by group width, and the first decode's
copy-on-write blocks counted before a group is admitted."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import run_all


def test_a_request_that_exactly_fits_runs(tiny_llama):
    """16-token prompt, max_tokens=1, block 16, a 1-block pool: the sampled token's K/V is never
    written, so the request runs in one block (it used to be refused as 'could never run')."""
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=16, num_gpu_blocks=1))
    out = eng.generate([list(range(1, 17))], SamplingParams(max_tokens=1, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 1
    with pytest.raises(ValueError, match="could never run"):   # one more token: a 2nd block
        eng.add_request(list(range(1, 17)), SamplingParams(max_tokens=2, ignore_eos=True))


@pytest.mark.parametrize("params", [SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=2,
                                                   ignore_eos=True),
                                    SamplingParams(beam_width=2, max_tokens=2, ignore_eos=True)])
def test_fan_out_requests_that_exactly_fit_run(tiny_llama, params):
    """15-token prompt in one partial block shared by 2 sequences; the first decode writes
    position 15 (copy-on-write for one of them), the second token is never written: exactly 2
    blocks (the old bound, prompt + max_tokens = 17 tokens, asked for 4). It is admitted and
    finishes; its decode, with 1 free block for 2 running sequences, first waits out a
    preemption, as vLLM v0's worst-case can_append_slots rule makes it."""
    prompt = list(range(1, 16))
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=16, num_gpu_blocks=2))
    assert eng.blocks_needed_worst_case(15, params) == 2
    rid = eng.add_request(prompt, params)
    kinds = [e.kind for r in run_all(eng) for e in r.events]
    assert len(eng.get_output(rid).outputs) == 2 and eng.get_output(rid).finished
    assert kinds.count("preempt") >= 1
    small = Engine(EngineConfig(model=tiny_llama[0], block_size=16, num_gpu_blocks=1))
    with pytest.raises(ValueError, match="could never run"):
        small.add_request(prompt, params)


def test_max_num_seqs_counts_the_group_width(tiny_llama):
    """Two n=4 requests with max_num_seqs=4: the second waits until the first is done (admission
    used to count a group as one sequence before its fork, running 8 at once)."""
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64, max_num_seqs=4))
    for seed in (1, 2):
        eng.add_request([3, 4, 5], SamplingParams(n=4, temperature=1.0, seed=seed, max_tokens=5,
                                                  ignore_eos=True))
    most = 0
    while eng.has_unfinished_requests():
        eng.step()
        most = max(most, sum(len(g.seqs) for g in eng.scheduler.running))
    assert most == 4


def test_first_decode_copies_are_counted_at_admission(tiny_llama):
    """Pool 6, block 4. A (8-token prompt) runs; B (6-token prompt, n=3) would take 2 blocks to
    prefill, then 2 copy-on-write copies at its first decode, while A needs 1 more: 5 > 4 free,
    so B waits instead of being admitted and preempted at once; A is never preempted. (Later,
    alone, B's three samples need a free block each before every decode, vLLM v0's worst-case
    rule, so B itself waits out a preemption in the small pool; the tokens are the same.)"""
    def run(blocks):
        eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=blocks))
        a = eng.add_request(list(range(10, 18)), SamplingParams(max_tokens=8, ignore_eos=True))
        eng.step()
        b = eng.add_request(list(range(30, 36)), SamplingParams(n=3, temperature=1.0, seed=4,
                                                                max_tokens=3, ignore_eos=True))
        results = run_all(eng)
        a_seq = eng.groups[a].all_seqs()[0].seq_id
        assert not [e for r in results for e in r.events
                    if e.kind == "preempt" and e.seq_id == a_seq]
        kinds = [e.kind for r in results for e in r.events]
        return kinds, [o.token_ids for rid in (a, b) for o in eng.get_output(rid).outputs]
    kinds, outs = run(6)
    roomy_kinds, roomy_outs = run(64)
    assert outs == roomy_outs and "preempt" not in roomy_kinds
    assert roomy_kinds.count("cow") == 2
