"""Real vLLM's snapshots (real_vllm/snapshots.py) against our v1 engine's own, on each
scenario's real-vLLM preset run to the end: since the two engines are identical step for step
(test_against_vllm.py), every field the page draws must be equal too — sequences, blocks (ref
counts, tokens, owners, hashes, states), pool stats, accounting and contiguous slabs, the
step's kind and its events (logprobs to 1e-3; the preemption rule's wording is ours)."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from app.scenarios import REAL_VLLM, SCENARIOS, preset, under_engine
from app.engine_build import build_engine
from app.trace_io import load_trace, trace_json
from tests.app.conftest import MODEL, needs_model

pytestmark = needs_model
PRESETS = [k for k, s in SCENARIOS.items() if s.real_vllm is not None]


def _event(e):
    if e.kind == "sample":
        return dataclasses.replace(e, logprob=round(e.logprob, 3))
    if e.kind == "preempt":
        return dataclasses.replace(e, rule="")
    return e


def differences(ours, theirs) -> list[str]:
    out = []
    if ours.sequences != tuple(dataclasses.replace(s, cumulative_logprob=o.cumulative_logprob)
                               for s, o in zip(theirs.sequences, ours.sequences)):
        pairs = [(a, b) for a, b in zip(ours.sequences, theirs.sequences) if a != b]
        out.append(f"sequences: {pairs[:1]}")
    if ours.blocks != theirs.blocks:
        out.append(f"blocks: {[(a, b) for a, b in zip(ours.blocks, theirs.blocks) if a != b][:1]}")
    sa, sb = dataclasses.asdict(ours.stats), dataclasses.asdict(theirs.stats)
    if sa != sb:
        out.append(f"stats: { {k: (sa[k], sb[k]) for k in sa if sa[k] != sb[k]} }")
    if (ours.accounting, ours.slabs, ours.kind) != (theirs.accounting, theirs.slabs, theirs.kind):
        out.append("accounting, slabs or kind")
    a, b = Counter(map(_event, ours.events)), Counter(map(_event, theirs.events))
    if a != b:
        out.append(f"events: ours only {list((a - b).elements())}, vLLM only "
                   f"{list((b - a).elements())}")
    return out


@pytest.mark.parametrize("scenario", PRESETS)
def test_real_vllm_snapshots_equal_our_v1s(monkeypatch, vllm_ready, scenario):
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    engine = build_engine(under_engine(preset(scenario, MODEL), REAL_VLLM))
    try:
        kinds = Counter()
        while engine.has_unfinished_requests():
            engine.step()
            ours, theirs = engine.ours.snapshot, engine.snapshot
            assert engine.steps[-1].difference is None, engine.steps[-1].difference
            found = differences(ours, theirs)
            assert not found, f"step {theirs.step}: {found}"
            kinds.update(e.kind for e in theirs.events)
            assert len(engine.steps) < 400
        assert theirs.semantics == REAL_VLLM and theirs.backend.startswith("real vLLM")
        snaps = list(engine.history)            # the Export tab's trace, loaded back
        assert load_trace(trace_json(snaps)) == snaps
        assert kinds["sample"] and kinds["free"] and (kinds["alloc"] or kinds["prefix_hit"])
        print(f"\n{scenario}: {engine.summary()}; events {dict(kinds)}")
    finally:
        engine.close()


WARM_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, os.getcwd())
os.environ["PAGED_LAB_REAL_VLLM"] = "1"
from app.scenarios import REAL_VLLM, preset, under_engine
from app.engine_build import build_engine
t0 = time.perf_counter()
engine = build_engine(under_engine(preset("parallel", sys.argv[1]), REAL_VLLM))
start = time.perf_counter() - t0
steps = []
for _ in range(3):
    t0 = time.perf_counter(); engine.step(); steps.append(time.perf_counter() - t0)
print(json.dumps({"start": start, "warm_up": engine.warm_up_s, "steps": steps}))
engine.close()
"""


def test_the_first_step_is_as_quick_as_the_next(vllm_ready):
    """Issue 38: vLLM compiled its sampler's rank count on the first Step (7.5 s here, then
    0.02 s a step), leaving the page greyed at step 0; the page engine compiles it while real
    vLLM starts. A fresh process, so nothing was compiled before."""
    import json
    import subprocess
    import sys
    from tests.app.conftest import ROOT
    out = subprocess.run([sys.executable, "-c", WARM_SCRIPT, MODEL], cwd=ROOT, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nreal vLLM start {got['start']:.1f} s (sampler warm-up {got['warm_up']:.1f} s), "
          "steps " + ", ".join(f"{s:.2f}" for s in got["steps"]) + " s")
    assert got["warm_up"] > 0
    assert got["steps"][0] < 1.5, "the first Step still compiles something"
