"""Our v0 engine against vLLM v0's own scheduler and block manager (vLLM 0.8.5, the last
release with the v0 engine, its pure-Python ``vllm.core`` run in a subprocess:
real_vllm/v0_reference.py), step by step: the step's kind, the groups scheduled with their
token counts, preemptions, every sequence's block table (physical ids), free blocks and the
copy-on-write copies. Skipped, saying why, where the 0.8.5 files are not unpacked."""
from __future__ import annotations

import pytest

from real_vllm.v0_lockstep import (V0Unavailable, first_difference, run_ours, run_reference,
                                   v0_dir)


def config(**kw) -> dict:
    base = dict(block_size=8, num_gpu_blocks=64, num_cpu_blocks=0, max_num_seqs=8,
                max_num_batched_tokens=256, max_model_len=128, preemption_mode=None)
    base.update(kw)
    return base


def req(rid: str, prompt_len: int, max_tokens: int, arrival: int = 0, n: int = 1) -> dict:
    return dict(id=rid, prompt=[3 + (3 * i + len(rid)) % 60 for i in range(prompt_len)],
                max_tokens=max_tokens, arrival_step=arrival, n=n)


V0_WORKLOADS = {
    # vLLM v0's worst-case can_append_slots: no free block, so it preempts before each decode
    "lone_request_in_a_two_block_pool": dict(
        config=config(block_size=16, num_gpu_blocks=2, max_model_len=64),
        requests=[req("a", 17, 3)]),
    "three_requests_with_arrivals": dict(
        config=config(), requests=[req("a", 20, 10), req("b", 13, 12), req("c", 30, 6, 2)]),
    "prefill_batch_budget": dict(
        config=config(max_num_batched_tokens=32, max_model_len=32),
        requests=[req("a", 20, 5), req("b", 20, 5), req("c", 10, 5)]),
    "max_num_seqs_2": dict(
        config=config(max_num_seqs=2),
        requests=[req(f"r{i}", 9 + 4 * i, 4 + i) for i in range(4)]),
    "n4_fork_after_prefill_copy_on_write": dict(
        config=config(), requests=[req("p", 13, 6, n=4)]),
    "n3_fork_at_a_block_boundary": dict(
        config=config(), requests=[req("p", 16, 5, n=3), req("q", 7, 9, 1)]),
}


# Pressure that preempts running requests: identical until vLLM re-admits the preempted
# request, which our v0 does later: our admission also reserves the next decode of everything
# running (docs/vllm-fidelity.md, "Where we differ from vLLM v0"), vLLM's checks only the
# prompt's blocks against its watermark
READMISSION = {
    "decode_preemption_by_recompute": dict(
        config=config(num_gpu_blocks=10, max_model_len=64),
        requests=[req("a", 20, 40), req("b", 20, 40)]),
    "decode_preemption_three_requests": dict(
        config=config(num_gpu_blocks=12, max_model_len=64),
        requests=[req("a", 12, 30), req("b", 9, 30), req("c", 14, 20, 3)]),
}


@pytest.fixture(scope="module")
def reference():
    """vLLM v0's views of every workload, from one subprocess."""
    where = v0_dir()
    if where is None:
        pytest.skip("vLLM 0.8.5's files are not unpacked in .vllm-v0/0.8.5 (bash "
                    "deploy/install_vllm.sh does it); the v0 differential needs them")
    names = sorted(V0_WORKLOADS) + sorted(READMISSION)
    workloads = {**V0_WORKLOADS, **READMISSION}
    try:
        views = run_reference([workloads[n] for n in names], where)
    except V0Unavailable as e:
        pytest.skip(f"{e} (the packages it needs come with vLLM 0.32: bash "
                    f"deploy/install_vllm.sh)")
    return dict(zip(names, views))


@pytest.mark.parametrize("name", sorted(V0_WORKLOADS))
def test_v0_matches_vllm_v0(reference, name):
    ours, theirs = run_ours(V0_WORKLOADS[name]), reference[name]
    assert first_difference(ours, theirs) is None, first_difference(ours, theirs)
    assert ours and ours[-1]["block_tables"] == {}
    preempts = sum(len(v["preempted"]) for v in ours)
    copies = sum(len(v["copies"]) for v in ours)
    print(f"\n{name}: identical for {len(ours)} of {len(ours)} steps, {preempts} preemptions, "
          f"{copies} copy-on-write copies")


@pytest.mark.parametrize("name", sorted(READMISSION))
def test_v0_differs_from_vllm_v0_only_where_it_readmits_a_preempted_request(reference, name):
    ours, theirs = run_ours(READMISSION[name]), reference[name]
    diff = first_difference(ours, theirs)
    assert diff is not None and "kind: ours decode, vLLM v0 prefill" in diff, diff
    at = int(diff.split(":")[0].split()[1]) - 1
    assert any(v["preempted"] for v in ours[:at]), "no preemption before the difference"
    waiting = {r for v in ours[:at] for r in v["preempted"]}
    assert {r for r, _ in theirs[at]["scheduled"]} <= waiting     # vLLM re-admits them
    print(f"\n{name}: identical for {at} steps, then vLLM v0 re-admits {sorted(waiting)}")
