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
from app.state import build_engine
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
