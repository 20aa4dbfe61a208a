"""Narration is built only from a step's events (plus the previous snapshot's refcounts)."""
from __future__ import annotations

import pytest

from app.narration import narrate
from engine import Engine, EngineConfig, SamplingParams
from engine import events as ev
from engine.observe.snapshot import PoolStats, StepSnapshot


def bare_snapshot(events, step=5, kind="decode"):
    stats = PoolStats(*([0] * 14))
    return StepSnapshot(step, kind, "m", "cpu-torch", "cpu", 4, (), (), (), stats, tuple(events),
                        0.0, ())


def test_init_and_idle():
    assert narrate(bare_snapshot([], step=0, kind="init")) == \
        "Nothing has run yet, and no request is queued."
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16))
    for n in (5, 6):
        eng.add_request(list(range(n)), SamplingParams(max_tokens=2))
    init = eng.history[0]                  # step 0 shows what is queued, and says it
    assert len(eng.history) == 1 and init.stats.num_waiting == 2
    assert narrate(init) == ("Nothing has run yet: 2 requests are queued and every block of "
                             "the pool is free. Press Step.")
    assert "nothing to run" in narrate(bare_snapshot([], kind="idle"))


def test_cow_sentence_with_refcounts(parallel_run):
    eng, results = parallel_run
    prev, snap = results[0].snapshot, results[1].snapshot
    cows = [e for e in snap.events if e.kind == "cow"]
    text = narrate(snap, prev)
    first = cows[0]
    assert (f"seq {first.seq_id} wrote into shared block P{first.src} (refcount 4) → copied to "
            f"P{first.dst}") in text
    assert f"(refcount 2) → copied to P{cows[-1].dst}" in text
    assert "wrote in place" in text                  # the last sharer
    assert text.startswith("Step 2 (decode):")
    # without the previous snapshot the refcount is simply not claimed
    assert "refcount" not in narrate(snap).split("Copy-on-write")[1].split(".")[0]


def test_fork_and_prefill(parallel_run):
    eng, results = parallel_run
    text = narrate(results[0].snapshot)
    assert "Prefill computed K/V for seq 0 tokens 0–9" in text
    assert "seq 0 forked into seqs 1, 2, 3" in text and "no K/V was copied" in text


def test_prefix_hits(prefix_run):
    eng, results = prefix_run
    text = narrate(results[0].snapshot)
    assert "Prefix cache hit: seq 1 reused P0, P1" in text
    assert "seq 2 reused P0, P1" in text


def test_preemption_and_swap(swap_run):
    eng, results = swap_run
    res = next(r for r in results if any(e.kind == "preempt" for e in r.events))
    pre = next(e for e in res.events if e.kind == "preempt")
    text = narrate(res.snapshot)
    assert f"seq {pre.seq_id} was preempted (swap" in text
    assert f"seq {pre.seq_id} swapped out: P" in text and "→C" in text
    back = next(r for r in results if any(e.kind == "swap_in" for e in r.events))
    assert "swapped back in: C" in narrate(back.snapshot)


def test_several_pruned_beams_read_as_plural():
    text = narrate(bare_snapshot([ev.BeamPrune(4, "pruned"), ev.BeamPrune(3, "pruned")]))
    assert "Pruned beams 3, 4: lower score than the kept candidates; their blocks" in text
    assert "  " not in text


def test_beam_prune_and_finish_decoded():
    events = [ev.Sample(4, 17, -0.5), ev.BeamPrune(3, "pruned"), ev.Free(9), ev.Free(2, cached=True),
              ev.Finish(1, "length"), ev.Finish(2, "stop")]
    text = narrate(bare_snapshot(events), decode=lambda ids: [f"tok{i}" for i in ids])
    assert "seq 4 'tok17'" in text
    assert "Pruned beam 3: lower score than the kept candidates; its blocks" in text
    assert "Finished: seq 1 (length); seq 2 (stop)" in text
    assert "2 block(s) reached refcount 0" in text and "1 keep their content" in text
    assert "P9, P2" in text


def test_recompute_preemption_sentence():
    text = narrate(bare_snapshot([ev.Preempt(7, "recompute"), ev.Free(3), ev.Free(4)]))
    assert "seq 7 was preempted (recompute: its blocks were freed" in text


def test_every_engine_step_narrates(beam_run, swap_run):
    for eng, _ in (beam_run, swap_run):
        snaps = list(eng.history)
        for prev, snap in zip(snaps, snaps[1:]):
            text = narrate(snap, prev)
            assert text.startswith(f"Step {snap.step} ")
            assert len(text) < 1500


def test_a_mid_run_reset_says_why_its_requests_were_preempted_once():
    from engine import Engine, EngineConfig, SamplingParams
    eng = Engine.length_only(EngineConfig(semantics="v1", block_size=4, num_gpu_blocks=32))
    for p in ([5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16]):
        eng.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
    eng.step()
    assert eng.reset_prefix_cache(reset_running_requests=True)
    text = narrate(eng.snapshot)
    assert "To reset the prefix cache mid-run, seqs 0, 1 were preempted." in text
    assert text.count("reset_running_requests=True") == 1 and "pool ran dry" not in text
    assert "every cached block forgot its hash" in text


# the words each kind's sentence starts with (or carries), to find it in the paragraph
SENTENCE_OF = {"preempt": "preempted", "prefill": "Prefill", "prefix_hit": "Prefix cache hit",
               "cached": "entered the prefix cache", "evict": "was evicted",
               "alloc": "New blocks", "fork": "forked into", "cow": "Copy-on-write",
               "sample": "Sampled", "beam_prune": "Pruned", "finish": "Finished",
               "free": "returned to the free list"}


def _check_order(snap, text: str | None = None) -> int:
    """The kinds' sentences appear in the order of their first events (in ``text``, default
    the narration of ``snap``); returns how many."""
    text = narrate(snap) if text is None else text
    order = []
    for e in snap.events:
        if e.kind in SENTENCE_OF and e.kind not in order:
            if e.kind == "alloc" and all(a.physical in {c.dst for c in snap.events
                                                        if c.kind == "cow"}
                                         for a in snap.events if a.kind == "alloc"):
                continue                 # told with the copy
            order.append(e.kind)
    where = [text.index(SENTENCE_OF[k]) for k in order]
    assert where == sorted(where), f"step {snap.step}: {order} in {text}"
    return len(order)


@pytest.mark.parametrize("scenario, semantics", [("beam", "v0"), ("mixed", "v1"),
                                                 ("parallel", "v0"), ("prefix", "v1")])
def test_narration_follows_the_order_of_events(scenario, semantics):
    from app.scenarios import preset, under_engine
    from app.engine_build import make_params, parse_prompts
    s = under_engine(preset(scenario), semantics)
    eng = Engine.length_only(EngineConfig(
        semantics=s.semantics, block_size=s.block_size, num_gpu_blocks=s.num_gpu_blocks,
        num_cpu_blocks=s.num_cpu_blocks, enable_prefix_caching=s.enable_prefix_caching,
        seed=s.seed, **({"max_num_batched_tokens": s.max_num_batched_tokens}
                        if semantics == "v1" else {})), max_model_len=s.max_model_len)
    for i, _ in enumerate(parse_prompts(s.prompts)):
        eng.add_request(list(range(10 + 4 * i)), make_params(s))
    checked = 0
    while eng.has_unfinished_requests() and eng.step_no < 200:
        eng.step()
        checked += _check_order(eng.snapshot)
    assert checked > eng.step_no            # more than one kind told in most steps


def test_a_block_freed_and_handed_out_in_one_step_is_told_as_such():
    events = [ev.Preempt(2, "recompute", "the rule"), ev.Free(22), ev.Alloc(1, 3, 22),
              ev.Append(1, 5, 3, 22, 88)]
    text = narrate(bare_snapshot(events))
    assert text.index("returned to the free list: P22") < text.index("New blocks: seq 1 ← P22")
    assert "P22 freed earlier in this step and handed out again" in text
