"""The two halves of the scheduler tap together (issue 40): the frames a real vLLM's
``TapScheduler`` publishes (in-process, as in test_tap.py), followed by the page's model
(real_vllm/tap/follower.py ``RankModel``): no invariant violated, no gap, nothing held back,
one snapshot per engine step, and each step's snapshot holds the block tables, ref counts and
free blocks that vLLM's scheduler held after that step's update (read directly)."""
from __future__ import annotations

from real_vllm.tap.follower import RankModel
from real_vllm.tap.frames import Frame

from tests.vllm_real.test_tap import run_tapped
from tests.vllm_real.workloads import toks


def follow(script, **kw):
    truths, messages, _, _ = run_tapped(script, **kw)
    model = RankModel(0)
    snaps = [s for seq, m in messages if (s := model.receive(seq, m)) is not None]
    updates = [t for t in truths if t["phase"] == "update"]
    frames = [m for _, m in messages if isinstance(m, Frame)]
    return model, snaps, updates, frames, [r for t in truths for r in t["preempted"]]


def check(model, snaps, updates, frames):
    assert model.violations == 0, list(model.violation_reasons)
    assert (model.gaps, model.held_back, model.restarts) == (0, 0, 0)
    steps = [f.step for f in frames if f.phase == "update"]
    assert len(snaps) == len(steps) == len(updates) > 10
    for snap, truth in zip(snaps, updates):
        where = f"step {snap.step}"
        tables = {s.request_id: list(s.block_table) for s in snap.sequences
                  if s.status != "finished" and s.block_table}
        held = {rid: t[0] for rid, t in truth["tables"].items() if t and t[0]}
        assert tables == held, where
        refs = {b.block_id: b.ref_count for b in snap.blocks if b.ref_count}
        assert refs == {b: ref for b, (ref, _) in truth["blocks"].items() if ref}, where
        assert snap.stats.free_blocks == truth["free"], where


def test_the_page_model_follows_a_real_vllm_with_preemption(vllm_ready):
    script = [("add", f"r{i}", toks(100 + 37 * i, 60), 60) for i in range(6)] + [("run",)]
    model, snaps, updates, frames, preempted = follow(script, num_blocks=12, keyframe_s=1000)
    check(model, snaps, updates, frames)
    assert model.num_preemptions >= 2, "the workload was meant to preempt"
    assert model.preemption_order() == preempted          # in the order vLLM preempted


def test_the_page_model_follows_shared_prefixes_and_keyframes(vllm_ready):
    prefix = toks(700, 64)
    script = [("add", f"a{i}", prefix + toks(900 + 50 * i, 10 + 7 * i), 20) for i in range(4)]
    script += [("step", 6)] + [("add", f"b{i}", prefix + toks(1500 + 50 * i, 5), 12)
                               for i in range(3)] + [("run",)]
    model, snaps, updates, frames, _ = follow(script, num_blocks=40, keyframe_s=0.05)
    check(model, snaps, updates, frames)
    assert any(b.ref_count > 1 for s in snaps for b in s.blocks), "nothing was shared"
    assert sum(f.keyframe for f in frames) >= 2
