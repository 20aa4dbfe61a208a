"""Figure builders are pure functions of snapshots: assert on the figures' data."""
from __future__ import annotations

import json

import plotly.graph_objects as go

from app.figures.beam_tree import beam_tree_figure, tree_order
from app.figures.block_tables import block_table_figure, table_rows
from app.figures.cow import cow_arrow_count, cow_figure, cow_rows
from app.figures.metrics import metrics
from app.figures.pool_grid import arrow_count, pool_figure
from app.figures.text_view import text_html
from app.figures.timeline import event_counts, timeline_figure
from app.figures.waste import CATEGORIES, waste_figure
from engine import StepSnapshot


def heatmap_cells(fig: go.Figure) -> list[tuple[float, str, str]]:
    """(z, text, hover) of every drawn cell of every heatmap in the figure."""
    cells = []
    for tr in fig.data:
        if tr.type != "heatmap":
            continue
        for zrow, trow, hrow in zip(tr.z, tr.text, tr.customdata):
            cells += [(z, t, h) for z, t, h in zip(zrow, trow, hrow) if z is not None]
    return cells


def fake_decode(ids):
    return [f"t{i}" for i in ids]


# ---- pool grid ---------------------------------------------------------------------------------
def test_pool_grid_one_cell_per_block_with_refcounts(parallel_run):
    eng, results = parallel_run
    snap = results[0].snapshot                      # after prefill + fork: 3 blocks, refcount 4
    fig = pool_figure(snap, decode=fake_decode)
    cells = heatmap_cells(fig)
    assert len(cells) == snap.stats.total_blocks == len(snap.blocks)
    for b in snap.blocks:
        text = cells[b.block_id][1]
        assert f"P{b.block_id}" in text
        if b.ref_count:
            assert f"rc {b.ref_count}" in text
            assert f"{b.filled}/{snap.block_size}" in text
    shared = [b for b in snap.blocks if b.ref_count > 1]
    assert len(shared) == snap.stats.shared_blocks == 3
    assert all("rc 4" in cells[b.block_id][1] for b in shared)
    # hover shows the tokens held, decoded
    b0 = snap.blocks[0]
    assert all(f"t{t}" in cells[0][2] for t in b0.token_ids)
    assert arrow_count(fig, "cow") == 0


def test_pool_grid_draws_one_arrow_per_cow(parallel_run):
    eng, results = parallel_run
    snap = results[1].snapshot
    n_cow = sum(e.kind == "cow" for e in snap.events)
    assert n_cow == 3
    assert arrow_count(pool_figure(snap), "cow") == n_cow
    assert arrow_count(pool_figure(snap, show_moves=False), "cow") == 0


def test_pool_grid_shows_cpu_pool_and_swap_arrows(swap_run):
    eng, results = swap_run
    res = next(r for r in results if any(e.kind == "swap_out" for e in r.events))
    snap = res.snapshot
    fig = pool_figure(snap)
    cells = heatmap_cells(fig)
    assert len(cells) == len(snap.blocks) + len(snap.cpu_blocks)
    swapped_cells = [c for c in cells if c[1].startswith("<b>C")]
    assert len(swapped_cells) == snap.stats.cpu_used_blocks > 0
    moved = sum(len(e.mapping) for e in snap.events if e.kind == "swap_out")
    assert arrow_count(fig, "swap") == moved


def test_pool_grid_cached_blocks(prefix_run):
    eng, results = prefix_run
    snap = results[0].snapshot
    assert sum(e.kind == "prefix_hit" for e in snap.events) == 4
    cells = heatmap_cells(pool_figure(snap))
    hit = next(e for e in snap.events if e.kind == "prefix_hit")
    assert "rc 3" in cells[hit.physical][1]          # the common prefix block, in 3 tables


# ---- block tables ------------------------------------------------------------------------------
def test_block_tables_map_logical_to_physical(parallel_run):
    eng, results = parallel_run
    snap = results[1].snapshot
    fig = block_table_figure(snap, decode=fake_decode)
    hm = fig.data[0]
    seqs = table_rows(snap)
    assert len(hm.y) == len(seqs) == 4
    rc = {b.block_id: b.ref_count for b in snap.blocks}
    for row, s in zip(hm.text, seqs):
        for logical, phys in enumerate(s.block_table):
            assert row[logical].startswith(f"<b>P{phys}</b>")
            assert (f"×{rc[phys]}" in row[logical]) == (rc[phys] > 1)


def test_block_tables_empty_when_nothing_lives(parallel_run):
    eng, _ = parallel_run
    fig = block_table_figure(eng.history[0])         # step 0: queued, no blocks yet
    assert not any(tr.type == "heatmap" for tr in fig.data)
    message = fig.layout.annotations[0].text
    assert "1 sequence(s) waiting in the queue" in message.replace("<br>", " ")
    # wrapped to the narrowest column at projector size (issue 38: it was cut at both ends)
    assert all(len(line) <= 39 for line in message.split("<br>"))
    assert eng.history[0].sequences[0].status == "waiting"


# ---- copy-on-write -----------------------------------------------------------------------------
def test_cow_arrows_equal_cow_events(parallel_run, beam_run):
    for eng, results in (parallel_run, beam_run):
        snaps = list(eng.history)
        for prev, snap in zip(snaps, snaps[1:]):
            n = sum(e.kind == "cow" for e in snap.events)
            assert cow_arrow_count(cow_figure(snap, prev)) == n
            assert len(cow_rows(snap, prev)) == n


def test_cow_rows_count_down_the_refcount(parallel_run):
    eng, results = parallel_run
    rows = cow_rows(results[1].snapshot, results[0].snapshot)
    assert [r["src refcount before"] for r in rows] == [4, 3, 2]
    assert len({r["shared src"] for r in rows}) == 1
    assert len({r["copy dst"] for r in rows}) == 3


# ---- timeline ----------------------------------------------------------------------------------
def test_timeline_counts_match_events(beam_run):
    eng, results = beam_run
    snaps = list(eng.history)
    fig = timeline_figure(snaps, current_step=3)
    counts = event_counts(snaps)
    for tr in fig.data:
        kind = tr.name                  # the lane label says its unit: "prefix hit (blocks)"
        assert dict(zip(tr.x, map(int, tr.text))) == counts[kind]
    total = sum(int(t) for tr in fig.data for t in tr.text)
    assert total == sum(len(s.events) for s in snaps)
    assert any(sh.type == "rect" for sh in fig.layout.shapes)   # the current-step band


# ---- beam tree ---------------------------------------------------------------------------------
def test_beam_tree_survivors_and_pruned(beam_run):
    eng, results = beam_run
    snaps = list(eng.history)
    snap = snaps[4]
    fig = beam_tree_figure(snap, snaps)
    assert "transformers" in fig.layout.title.text and "vLLM v0" in fig.layout.title.text
    ends = [tr for tr in fig.data if tr.mode == "markers"]       # one per sequence, its status
    lines = [tr for tr in fig.data if tr.mode == "lines" and tr.name != "fork"]
    forks = [tr for tr in fig.data if tr.name == "fork"]
    assert len(ends) == len(snap.sequences)
    assert len(forks) == sum(s.parent_seq_id is not None for s in snap.sequences)
    pruned = [s for s in snap.sequences if s.status == "pruned"]
    assert pruned and len([tr for tr in ends if tr.name == "pruned"]) == len(pruned)
    assert all(tr.line.dash == "dash" for tr in lines if tr.name == "pruned")
    running = [tr for tr in ends if tr.name == "running"]
    assert len(running) == 3                         # beam width survivors
    labels = [a.text for a in fig.layout.annotations if a.name == "seq-label"]
    assert len(labels) == len(snap.sequences)


def test_the_tree_draws_each_sequence_in_the_status_it_had_at_each_step(swap_run):
    """A sequence preempted after running is drawn running up to its preemption, then
    swapped / waiting, not in its present status from its birth."""
    eng, _ = swap_run
    snaps = list(eng.history)
    pre = next((s, e) for s in snaps for e in s.events if e.kind == "preempt")
    snap, victim = pre[0], pre[1].seq_id
    fig = beam_tree_figure(snap, snaps)
    y = [i for i, s in enumerate(tree_order(snap.sequences)) if s.seq_id == victim][0]
    pieces = [(tr.x, tr.name) for tr in fig.data if tr.mode == "lines" and tr.name != "fork"
              and tr.y[0] == y]
    names = [n for _, n in pieces]
    assert "running" in names[:-1] and names[-1] in ("swapped", "waiting"), pieces
    ran = pieces[names.index("running")][0]
    assert ran[0] < ran[1] <= pieces[-1][0][0]      # ran for steps, then the status changed


def test_fork_tree_for_parallel_sampling(parallel_run):
    eng, results = parallel_run
    fig = beam_tree_figure(results[-1].snapshot, list(eng.history))
    assert "Sequence tree" in fig.layout.title.text
    assert sum(tr.name == "fork" for tr in fig.data) == 3


# ---- waste -------------------------------------------------------------------------------------
def test_waste_bars_match_accounting(swap_run):
    eng, results = swap_run
    snaps = list(eng.history)
    snap = snaps[8]
    fig = waste_figure(snap, snaps)
    bars = {tr.legendgroup: tr for tr in fig.data if tr.type == "bar"}
    assert set(bars) == set(CATEGORIES)
    allocators = [a.allocator for a in snap.accounting]
    assert allocators[0] == "paged" and len(allocators) == 4
    for field, tr in bars.items():
        assert list(tr.x) == [getattr(a, field) for a in snap.accounting]
    shares = [tr for tr in fig.data if tr.type == "scatter" and ".0%" in tr.hovertemplate]
    assert len(shares) == 4 and len(shares[0].x) == 8          # steps 1..8
    paged = shares[0]
    a = snap.accounting[0]
    busy = a.token_states + a.reserved + a.internal_fragmentation + a.external_fragmentation
    assert abs(paged.y[-1] - a.token_states / busy) < 1e-9
    waiting = [tr for tr in fig.data if tr.type == "scatter" and "waiting" in tr.hovertemplate]
    assert [tr.y[-1] for tr in waiting] == [x.waiting for x in snap.accounting]


# ---- text + metrics ----------------------------------------------------------------------------
def test_text_marks_block_boundaries(parallel_run):
    eng, results = parallel_run
    snap = results[-1].snapshot
    html = text_html(snap, fake_decode)
    assert html.count('class="seqtext"') == len(snap.sequences)
    assert html.count('class="blk ') == sum(len(s.block_table) for s in snap.sequences)
    pending = [s for s in snap.sequences if s.num_tokens > len(s.block_table) * snap.block_size]
    assert html.count('class="pending"') == len(pending) == 4    # sampled, K/V written next step
    s = snap.sequences[1]
    for phys in s.block_table:
        assert f">P{phys}</sup>" in html
    assert "<script" not in text_html(snap, lambda ids: ["<script>"] * len(ids))


def test_metrics_read_pool_stats(parallel_run):
    eng, results = parallel_run
    snap = results[1].snapshot
    m = {x.label: x.value for x in metrics(snap)}
    st = snap.stats
    assert m["blocks used"].startswith(f"{st.used_blocks}/{st.total_blocks}")
    assert m["shared blocks"] == str(st.shared_blocks)
    assert m["saved (sharing)"].startswith(str(st.logical_blocks - st.used_blocks))
    assert m["backend"] == snap.backend


# ---- all views, every snapshot, and from a JSON round trip -------------------------------------
def test_every_view_builds_for_every_snapshot_and_round_trip(beam_run, swap_run):
    for eng, _ in (beam_run, swap_run):
        snaps = list(eng.history)
        picked = snaps[::max(1, len(snaps) // 4)]        # a few, across the run (keeps it fast)
        loaded = [StepSnapshot.from_dict(json.loads(json.dumps(s.to_dict()))) for s in picked]
        for snap, again in zip(picked, loaded):
            i = snaps.index(snap)
            prev = snaps[i - 1] if i else None
            for build in (lambda s: pool_figure(s), lambda s: block_table_figure(s),
                          lambda s: cow_figure(s, prev), lambda s: beam_tree_figure(s, snaps),
                          lambda s: waste_figure(s, snaps)):
                a, b = build(snap), build(again)
                assert isinstance(a, go.Figure)
                assert a.to_json() == b.to_json()
            assert text_html(snap) == text_html(again)


def test_waste_flags_requests_a_baseline_can_never_fit(parallel_run):
    eng, results = parallel_run
    snap = results[-1].snapshot          # Max reserves 256 slots x 4 samples: more than the pool
    assert {a.allocator: a.rejected for a in snap.accounting}["max"] == 1
    fig = waste_figure(snap, list(eng.history))
    names = fig.data[0].y
    assert [n for n in names if "never fit" in n] == ["Contiguous Max<br><i>1 never fit</i>"]


def test_generated_tokens_differ_from_the_prompt_by_more_than_colour():
    import re

    from engine import SamplingParams
    from .conftest import run_length_only
    eng, results = run_length_only([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=4,
                                                                     ignore_eos=True), 3)
    page = text_html(results[-1].snapshot)
    prompt = re.findall(r'<span class="prompt" style="([^"]*)"', page)
    generated = re.findall(r'<span class="generated" style="([^"]*)"', page)
    assert len(prompt) == 5 and len(generated) == 3
    assert all("font-weight:bold" in g and "underline" in g for g in generated)
    assert not any("bold" in p or "underline" in p for p in prompt)


# ---- the figures redrawn on every Step: validated here, not on the page ------------------------
def test_every_step_figure_passes_plotlys_validation():
    """make_figure skips Plotly's validation at run time (app/figures/common.py), so every
    figure built that way is validated here, for every preset's every step: Plotly raises on
    any property name or value it does not know."""
    from app.figures.common import empty
    from app.scenarios import SCENARIOS
    from app.lab import Lab
    checked = 0
    for key in SCENARIOS:
        lab = Lab.create(key)
        while True:
            snap = lab.current()
            for fig in (pool_figure(snap, lab.decode), block_table_figure(snap, lab.decode),
                        cow_figure(snap, lab.previous())):
                go.Figure(fig.to_dict())               # validates; raises ValueError if not
                checked += 1
            if lab.finished or not lab.step():
                break
    go.Figure(empty("t", "nothing").to_dict())
    assert checked > 100


def test_a_servers_long_request_ids_leave_room_for_the_cells():
    """A vLLM server's ids ("cmpl-<16 hex>-0-<8 hex>", the scheduler tap) are shortened in the
    block tables' row labels, so the cells keep their labels; the hover names the whole id."""
    import dataclasses
    from tests.app.conftest import run_length_only
    from engine import SamplingParams
    eng, _ = run_length_only([[1, 2, 3, 4, 5, 6, 7, 8, 9]], SamplingParams(max_tokens=4), 2)
    snap = eng.history[-1]
    rid = "cmpl-ad0d44f82968051c-0-bbdf46ba"
    snap = dataclasses.replace(snap, sequences=tuple(
        dataclasses.replace(s, request_id=rid) for s in snap.sequences))
    heat = block_table_figure(snap).data[0]
    assert all(rid not in label and len(label) < 50 for label in heat.y), heat.y
    assert any(t for row in heat.text for t in row), "the cells lost their labels"
    assert any(rid in h for row in heat.customdata for h in row if h)
