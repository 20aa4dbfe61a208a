"""Our v1 engine against the real vLLM (0.32, CPU build), step by step, on the same model,
token ids and settings: tokens scheduled per request, preemptions, queues, computed tokens,
block tables (physical ids), ref counts, the free queue, cached hashes, KV event batches (bytes,
hashes included), sampled tokens and finishes; then outputs, stop reasons and
num_cached_tokens. Any difference fails with the first one named."""
from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from real_vllm.lockstep import Lockstep
from tests.vllm_real.workloads import P64, WORKLOADS, Workload, toks

MAX_STEPS = 400


def run_workload(w: Workload) -> Lockstep:
    ls = Lockstep.start(Engine(EngineConfig(**w.config())))
    try:
        for call in w.script:
            if call[0] == "add":
                _, rid, prompt, kw, *salt = call
                ls.add_request(rid, prompt, SamplingParams(**kw), salt[0] if salt else None)
            elif call[0] == "abort":
                ls.abort_request(call[1])
            elif call[0] == "reset":
                ours, theirs = ls.reset_prefix_cache(call[1])
                assert ours == theirs, f"reset_prefix_cache: ours {ours}, vLLM {theirs}"
            else:
                k = call[1] if call[0] == "step" else MAX_STEPS
                for _ in range(k):
                    if call[0] == "run" and not ls.has_unfinished_requests():
                        break
                    step = ls.step()
                    assert step.difference is None, f"{w.name}: {step.difference}"
                assert call[0] == "step" or not ls.has_unfinished_requests()
        return ls
    except BaseException:
        ls.close()
        raise


def check_outputs(ls: Lockstep) -> None:
    eng, vllm = ls.engine, ls.vllm
    for rid, group in eng.groups.items():
        ours = eng.outputs.request_output(group)
        theirs = vllm.completions.get(rid)
        if group.seqs == [] and ours.outputs[0].finish_reason == "abort":
            continue                       # vLLM's LLMEngine reports nothing for an abort
        assert theirs is not None, f"{rid}: no output from vLLM"
        out = ours.outputs[0]
        assert (out.token_ids, out.finish_reason, out.stop_reason, out.text) == \
            (theirs.token_ids, theirs.finish_reason, theirs.stop_reason, theirs.text), rid
        assert ours.num_cached_tokens == vllm.num_cached_tokens[rid], rid
    for parent in eng.children:
        assert eng.get_output(parent).num_cached_tokens == vllm.num_cached_tokens[parent]


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_workload_matches_real_vllm(vllm_ready, workload):
    ls = run_workload(workload)
    try:
        check_outputs(ls)
        assert ls.steps and all(s.difference is None for s in ls.steps)
        batches = sum(len(s.theirs.kv_events) for s in ls.steps)
        sampled = sum(len(t) for s in ls.steps for t in s.theirs.new_tokens.values())
        assert batches > 0 or workload.name in ("eos_allowed_beside_ignore_eos",
                                                "no_prefix_caching_under_pressure"), \
            "no KV events compared"
        print(f"\n{workload.name}: {ls.summary()}, {batches} KV event batches, "
              f"{sampled} sampled tokens, all equal")
    finally:
        ls.close()


def test_stop_strings_match_real_vllm(vllm_ready):
    """A stop string taken from the greedy text itself, so it is sure to be met. The second
    request starts a step later: two requests ending on stop strings in one step are freed in
    an order vLLM leaves to a set of random request ids (docs/vllm-fidelity.md)."""
    config = EngineConfig(**Workload("probe", []).config())
    prompt = toks(500, 24)
    probe = Engine(config).generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    text = probe.outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), f"no stop string to take from {text!r}"
    w = Workload("stop_strings", [
        ("add", "a", prompt, dict(max_tokens=16, ignore_eos=True, stop=[stop])), ("step", 1),
        ("add", "b", prompt, dict(max_tokens=16, ignore_eos=True, stop=[stop],
                                  include_stop_str_in_output=True)), ("run",)])
    ls = run_workload(w)
    try:
        check_outputs(ls)
        texts = [ls.engine.get_output(r).outputs[0].text for r in ("a", "b")]
        assert texts[0] + stop == texts[1] and ls.engine.get_output("a").outputs[0].finish_reason == "stop"
    finally:
        ls.close()


def test_viewing_vllm_changes_nothing(vllm_ready):
    """The adapter's ``view()`` only reads: ``drain()`` (which ``step()`` calls) takes what
    arrived. Two views after a step are equal, a second drain finds nothing, and the step's
    view still holds its tokens and KV batches."""
    ls = run_workload(Workload("view_twice", [
        ("add", "p", P64 + toks(600, 5), dict(n=2, temperature=1.0, seed=4, max_tokens=6,
                                              ignore_eos=True)), ("step", 1)]))
    try:
        stepped = ls.steps[-1].theirs
        first, again = ls.vllm.view(), ls.vllm.view()
        assert first == again == stepped
        assert stepped.new_tokens and sum(len(t) for t in stepped.new_tokens.values()) == 2
        assert stepped.kv_events, "no KV event batch in the step"
        assert set(stepped.new_tokens) == {"0_p", "1_p"}            # vLLM's child ids
        counts = dict(ls.vllm.prefix_cache)
        assert ls.vllm.drain() == ({}, {}, [])
        assert ls.vllm.prefix_cache == counts
        assert ls.vllm.request("0_p") is not None and ls.vllm.request("p") is None
    finally:
        ls.close()
