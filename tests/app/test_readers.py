"""Issue 38: what a newcomer, a teacher and a vLLM engineer found wrong on the page, one test
per finding that is state (AppTest) or a pure figure (its geometry read from the figure). The
layout findings are measured in Chromium in tests/app/test_browser_readers.py."""
from __future__ import annotations

import pytest

from app.lessons import LESSONS

from .conftest import needs_model
from .test_page import app, chart, lab, step  # noqa: F401  (fixture + helpers)

pytestmark = needs_model


def _lessons(at, key: str) -> None:
    at.radio(key="w_mode").set_value("Lessons").run()
    at.selectbox(key="w_lesson").set_value(key).run()
    assert not at.exception


def _next(at) -> None:
    at.button(key="lesson_next").click().run()
    assert not at.exception


# 1. a checkpoint's answer box starts empty, never with the previous checkpoint's answer
def test_answer_box_is_empty_at_each_new_checkpoint(app):
    at = app
    _lessons(at, "parallel")
    asked = 0
    for _ in range(len(LESSONS["parallel"].checkpoints)):
        if not [b for b in at.button if b.key == "lesson_next"]:
            break
        _next(at)
        boxes = [t for t in at.text_input if t.key == "w_lesson_answer"]
        if not boxes:
            continue
        assert boxes[0].value == "", f"checkpoint {lab(at)} box holds {boxes[0].value!r}"
        boxes[0].input("4").run()
        at.button(key="lesson_check").click().run()
        asked += 1
    assert asked >= 2


# 17. the README's command reads a config without the file watcher

def test_the_readme_command_runs_without_a_file_watcher():
    """The watcher walks every module in sys.modules after each run; under real vLLM that
    includes transformers' lazy model packages, whose optional imports (torchvision) then log
    a traceback each (2,472 in 12 minutes, issue 38). The config the README's command reads
    turns it off."""
    import subprocess
    import sys
    from .conftest import ROOT
    shown = subprocess.run([sys.executable, "-m", "streamlit", "config", "show"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60).stdout
    assert 'fileWatcherType = "none"' in shown


# ---- pure figures ----------------------------------------------------------------------------
def _curve(path: str, n: int = 60):
    """Points of a quadratic path "M x0,y0 Q cx,cy x1,y1" (the pool's arrows)."""
    import re
    x0, y0, cx, cy, x1, y1 = map(float, re.findall(r"-?\d+(?:\.\d+)?", path))
    pts = []
    for i in range(1, n):
        t = i / n
        pts.append(((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t * t * x1,
                    (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1))
    return pts


# 6. copy-on-write arrows neither cross nor overlap each other, nor pass over a cell
@pytest.mark.parametrize("n", [3, 4, 6])
def test_cow_arrows_stay_off_cells_and_apart(n):
    from app.figures.pool_grid import pool_figure
    from engine import SamplingParams
    from .conftest import run_length_only
    eng, _ = run_length_only([list(range(1, 11))],
                             SamplingParams(n=n, temperature=1.0, max_tokens=4, ignore_eos=True),
                             3)
    snap = next(s for s in eng.history if any(e.kind == "cow" for e in s.events))
    fig = pool_figure(snap)
    arcs = [_curve(sh.path) for sh in fig.layout.shapes if sh.name == "cow"]
    assert len(arcs) == n - 1
    cols = 8
    for arc in arcs:
        for x, y in arc:
            for i in range(len(snap.blocks)):     # inside no cell (gaps of 3 px ignored)
                cx, cy = i % cols, i // cols
                assert not (abs(x - cx) < 0.45 and abs(y - cy) < 0.45), (x, y, i)
    for i, a in enumerate(arcs):
        for b in arcs[i + 1:]:
            gap = min(((xa - xb) ** 2 + (ya - yb) ** 2) ** 0.5 for xa, ya in a for xb, yb in b)
            assert gap > 0.04, f"two arrows touch (closest {gap:.3f} cells)"
    lo = fig.layout.yaxis.range[1]
    assert all(y > lo for arc in arcs for _, y in arc), "an arrow leaves the plot at the top"


# 2, 6. a legend line fits the narrowest column at projector size
def test_legend_lines_fit_the_narrowest_column(parallel_run):
    import re
    from app.figures.common import CHAR_EM, NARROW_PX, PROJECTOR_MIN_FONT
    from app.figures.block_tables import block_table_figure
    from app.figures.pool_grid import pool_figure
    eng, _ = parallel_run
    snap = next(s for s in eng.history if any(e.kind == "cow" for e in s.events))
    for fig in (pool_figure(snap), block_table_figure(snap)):
        note = next(a for a in fig.layout.annotations if a.name == "legend")
        for line in note.text.split("<br>"):
            plain = re.sub(r"<[^>]+>", "", line)
            assert len(plain) * CHAR_EM * PROJECTOR_MIN_FONT <= NARROW_PX, plain


# 7. pruned beams are drawn as the legend says, and no fork connector crosses a line
def _beam_history():
    from engine import SamplingParams
    from .conftest import run_length_only
    eng, _ = run_length_only([list(range(1, 8))],
                             SamplingParams(beam_width=4, max_tokens=10, ignore_eos=True), 10,
                             num_gpu_blocks=64)
    return eng.history


def test_pruned_beams_are_dashed_and_connectors_cross_nothing():
    from app.figures.beam_tree import STATUS_STYLE, beam_tree_figure
    history = _beam_history()
    checked = 0
    history = list(history)
    for snap in history[1:]:
        fig = beam_tree_figure(snap, history)
        lines = [t for t in fig.data if t.mode == "lines" and t.name != "fork"]
        pruned = {s.seq_id for s in snap.sequences if s.status == "pruned"}
        for t in lines:
            if t.hovertext and int(t.hovertext[0].split()[1]) in pruned:
                assert (t.line.dash, t.line.color) == STATUS_STYLE["pruned"][:2][::-1], t
                checked += 1
        for fork in (t for t in fig.data if t.name == "fork"):
            (x0, x1), (y0, y1) = fork.x, fork.y
            for t in lines:
                r = t.y[0]
                if min(y0, y1) < r < max(y0, y1):
                    x = x0 + (r - y0) / (y1 - y0) * (x1 - x0)
                    assert not (min(t.x) <= x <= max(t.x)), \
                        f"step {snap.step}: a fork connector crosses the line of row {r}"
    assert checked, "no pruned beam drawn"


# 8. the paged row's empty last-block slots are "not yet filled", as the headline says; the
#    per-request table fits (five columns) and never shows a raw None
def test_waste_names_paged_slack_as_the_headline_does(swap_run):
    from app.figures.address_space import address_space_figure
    from app.figures.waste import request_table_long, waste_headline
    eng, _ = swap_run
    snap = next(s for s in eng.history
                if any(0 < b.filled < s.block_size and b.ref_count for b in s.blocks))
    fig = address_space_figure(snap)
    names = {t.name for t in fig.data if len(t.x)}
    assert "paged: last-block slots not yet filled" in names
    paged = [t for t in fig.data if t.name.startswith("internal")]
    assert all("Paged" not in y for t in paged for y in t.y), "paged slack drawn as never used"
    assert "not yet filled" in waste_headline(snap)
    table = request_table_long(snap)
    assert list(table.columns) == ["request", "allocator", "slots", "tokens stored",
                                   "empty slots", "note"]
    assert "None" not in table.astype(str).to_string().replace("<NA>", "")
    missing = table[table["slots"].isna()]
    assert all(missing["note"].str.startswith("not admitted")), missing


# 9. timeline lanes say what they count; the prefix-cache metric says tokens
def test_prefix_counts_name_their_units(prefix_run):
    from app.figures.metrics import metrics
    from app.figures.timeline import timeline_figure
    eng, _ = prefix_run
    snaps = list(eng.history)
    fig = timeline_figure(snaps)
    lanes = {t.name: t.y[0] for t in fig.data}
    assert lanes["prefix_hit"] == "prefix hit (blocks)"
    m = {x.label: x.value for x in metrics(snaps[-1])}
    assert m["prefix-cache hits"].endswith(" tokens")


# 9, also wanted: each event in plain words, naming blocks and sequences as the page does
def test_every_event_kind_has_plain_words(parallel_run, beam_run, swap_run, prefix_run):
    from app.event_words import WORDS, describe
    from engine.events import EVENT_KINDS
    assert set(WORDS) == set(EVENT_KINDS)
    seen = set()
    for eng, _ in (parallel_run, beam_run, swap_run, prefix_run):
        for snap in eng.history:
            for e in snap.events:
                text = describe(e, snap.block_size)
                assert "{" not in text and "=" not in text, text
                for field in ("seq_id", "physical", "src", "dst"):
                    if hasattr(e, field):
                        assert str(getattr(e, field)) in text, (e, text)
                seen.add(e.kind)
    assert {"alloc", "cow", "fork", "prefix_hit", "swap_out", "beam_prune", "free"} <= seen


# 11. the Text tab's bands carry the Memory tab's state colours, by the block's state
def test_text_bands_use_the_memory_tabs_state_colours(parallel_run):
    import re
    from app.figures.common import STATE_COLORS
    from app.figures.text_view import text_html
    eng, _ = parallel_run
    snap = next(s for s in eng.history if s.stats.shared_blocks)
    html = text_html(snap)
    refs = {b.block_id: b.ref_count for b in snap.blocks}
    bands = re.findall(r'class="blk (\w+)" style="([^"]*)"><sup[^>]*>P(\d+)<', html)
    assert bands
    for state, style, block in bands:
        want = "shared" if refs[int(block)] > 1 else "used"
        assert state == want and f"border-left:4px solid {STATE_COLORS[want]}" in style
        other = STATE_COLORS["used" if want == "shared" else "shared"]
        assert other not in style, f"P{block}'s band wears the other state's colour"


# 12. an engine named as the API does becomes the Engine choice the page shows
def test_refusals_name_the_engine_choice_not_the_api():
    from app.messages import page_words
    from engine.sched.v1 import BEAM_SEARCH_IN_V1
    text = page_words(BEAM_SEARCH_IN_V1)
    assert "semantics=" not in text and "the Engine “vLLM v0”" in text


# 13. no free real-vLLM slot: the message says when one frees
def test_real_vllm_busy_says_when_a_slot_frees(monkeypatch):
    from types import SimpleNamespace
    from app.real_vllm_slots import real_vllm_busy
    monkeypatch.setenv("PAGED_LAB_DISCONNECTED_SECONDS", "30")
    closed = SimpleNamespace(disconnected_since=100.0)
    text = real_vllm_busy(1, 1, [closed], now=112.0)
    assert "frees in about 23 s" in text and "tab was closed" in text
    open_tab = SimpleNamespace(disconnected_since=None)
    assert "held by an open tab" in real_vllm_busy(1, 1, [open_tab], now=112.0)


# 10. v0 and v1 count the same four samples as 1 and 4 running requests: the page says why
def test_compare_says_why_running_counts_differ():
    from app.views.compare import running_differs, running_words
    from engine import SamplingParams
    from .conftest import run_length_only
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True)
    snaps = [run_length_only([list(range(1, 11))], params, 3, semantics=name)[0].history[-1]
             for name in ("v0", "v1")]
    assert [s.stats.num_running for s in snaps] == [1, 4]
    assert running_words(snaps[0]) == "1 running request (4 sequences)"
    assert running_words(snaps[1]) == "4 running requests"
    why = running_differs(snaps)
    assert "one sequence group" in why and "child requests" in why
    assert running_differs([snaps[0], snaps[0]]) == ""


# 5. a link carries scenario and step, or lesson and checkpoint, and opens there
def _open(monkeypatch, **query):
    from streamlit.testing.v1 import AppTest
    from .conftest import MODEL, ROOT
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception
    return at


def test_a_link_opens_the_scenario_at_its_step(monkeypatch):
    at = _open(monkeypatch, scenario="parallel", step="2")
    assert lab(at).settings.scenario == "parallel" and lab(at).current().step == 2
    assert at.selectbox(key="w_scenario").value == "parallel"
    at2 = _open(monkeypatch, lesson="parallel", checkpoint="2")
    run = at2.session_state["lesson_run"]
    assert run.lesson.key == "parallel" and run.index == 1
    assert at2.radio(key="w_mode").value == "Lessons"
    bad = _open(monkeypatch, scenario="nope", step="2")
    assert any("scenario='nope'" in e.value for e in bad.error)
    assert lab(bad).current().step == 0


# 4. slides: the page's scenario name, no "Press Step.", ref counts, the lesson's questions,
#    copy-on-write and Waste figures
def test_slides_carry_what_the_page_shows(parallel_run):
    import json
    import re
    from app.figures.slides import slides_deck
    from app.narration import narrate
    eng, _ = parallel_run
    snaps = list(eng.history)
    prev = {id(s): (snaps[i - 1] if i else None) for i, s in enumerate(snaps)}
    lesson = LESSONS["parallel"]
    deck = slides_deck(snaps, None, lambda s: narrate(s, prev[id(s)], None, cue=False),
                       title="PagedAttention Lab: Parallel sampling",
                       questions=[(c.text, c.question.text if c.question else None)
                                  for c in lesson.checkpoints])
    data = json.loads(re.search(r"const SLIDES = (.*?);\n", deck.html).group(1)
                      .replace("<\\/", "</"))
    assert "Press Step" not in data[0]["text"]
    assert data[1]["kind"] == "lesson"
    import html
    assert all(html.escape(c.question.text) in data[1]["text"]
               for c in lesson.checkpoints if c.question)
    cow = [s for s in data if "cow" in s]
    assert cow and all("refcount" in s["text"] for s in cow)
    assert all("waste" in s for s in data if s["kind"] not in ("lesson", "init"))


# also wanted: a block's hover names its tokens and the sequences that hold it, on both figures
def test_block_hovers_name_tokens_and_holders(parallel_run):
    from app.figures.block_tables import block_table_figure
    from app.figures.pool_grid import pool_figure
    eng, _ = parallel_run
    snap = next(s for s in eng.history if s.stats.shared_blocks)
    decode = lambda ids: [f"t{i}" for i in ids]              # noqa: E731
    pool = next(t for t in pool_figure(snap, decode).data if t.type == "heatmap")
    hovers = {h.split("</b>")[0].split("<b>")[-1]: h for row in pool.customdata for h in row if h}
    tables = next(t for t in block_table_figure(snap, decode).data if t.type == "heatmap")
    cells = [h for row in tables.customdata for h in row if h]
    for b in snap.blocks:
        if not b.ref_count:
            continue
        holders = ", ".join(map(str, b.seq_ids))
        h = hovers[f"P{b.block_id}"]
        assert f"held by seq{'s' if len(b.seq_ids) > 1 else ''} {holders}" in h
        assert all(f"t{t}" in h for t in b.token_ids), h
        assert any(f"<b>P{b.block_id}</b>" in c and holders in c for c in cells)


# 13. another tab of the same browser hands its real-vLLM slot over; other browsers keep theirs
def test_a_tab_of_the_same_browser_hands_real_vllm_over():
    import threading
    from app.real_vllm_slots import hand_over_real_vllm

    class Holder:
        def __init__(self, browser):
            self.browser, self.released, self.why = browser, False, None
            self._lock = threading.RLock()

        def release(self, why):
            self.released, self.why = True, why

    mine, theirs, busy = Holder("b1"), Holder("b2"), Holder("b1")
    held = threading.Event()
    done = threading.Event()

    def hold():                          # a script run of that tab holds its lab right now
        with busy._lock:
            held.set()
            done.wait(5)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        assert hand_over_real_vllm([mine, theirs, busy], "b1") == 1
    finally:
        done.set()
        t.join()
    assert mine.released and mine.why == "handed over"
    assert not theirs.released and not busy.released
    assert hand_over_real_vllm([theirs], None) == 0


# 3. a question on a step that prefilled several sequences says it wants their total, and the
#    end of a lesson in the projector (no sidebar) points at the projector's Lesson menu
def test_prefill_question_is_unambiguous_and_the_end_fits_the_projector(app):
    from app.lessons import prefill_tokens
    for lesson in LESSONS.values():
        for cp in lesson.checkpoints:
            if cp.question is not None and cp.question.answer is prefill_tokens \
                    and lesson.key == "preemption":
                assert "together" in cp.question.text, cp.question.text
    at = app
    at.session_state["w_projector"] = True
    _lessons(at, "single")
    for _ in range(12):
        nxt = [b for b in at.button if b.key == "lesson_next"]
        if not nxt:
            break
        nxt[0].click().run()
        assert not at.exception
    done = [s.value for s in at.success if s.value.startswith("Lesson complete")]
    assert done and "sidebar" not in done[0] and "Lesson menu above" in done[0]


# 2: the CPU swap pool is drawn where the engine swaps, and left out where it never can
def test_the_cpu_pool_is_drawn_only_where_the_engine_swaps(app):
    from .test_page import pool_cells
    at = app
    at.selectbox(key="w_scenario").set_value("mixed").run()
    assert not [c for c in pool_cells(chart(at, "fig_pool")) if c.startswith("C")]
    at.radio(key="w_preemption_mode").set_value("swap")
    at.form_submit_button[0].click().run()
    assert not at.exception and lab(at).settings.preemption_mode == "swap"
    cpu = [c for c in pool_cells(chart(at, "fig_pool")) if c.startswith("C")]
    assert len(cpu) == lab(at).settings.num_cpu_blocks


# 15. under real vLLM: the prefix tree counts in steps and names its nodes, the Waste rows name
#     real vLLM, the Events tab's sentence ends
def test_real_vllm_views_name_what_they_show(prefix_run):
    import dataclasses
    import inspect
    from app.figures.prefix_tree import prefix_tree_figure
    from app.figures.waste import allocator_label
    from app.views import events
    from engine.kv_events.cache_view import CachedBlock
    blocks = [CachedBlock(bytes([i]) * 32, bytes([i - 1]) * 32 if i else None, (i,) * 4, 4, 0,
                          "GPU", 0, i, 0.0, stores) for i, stores in enumerate([1, 2, 3, 1])]
    fig = prefix_tree_figure(blocks)
    nodes = [t for t in fig.data if t.customdata]
    assert not any(t.marker.showscale or t.marker.colorbar.title.text for t in nodes)
    assert {t.name for t in nodes} == {"stored once", "stored twice", "stored 3× or more"}
    assert all(text == h[:6] for t in nodes for text, h in zip(t.text, t.customdata))
    eng, _ = prefix_run
    snap = eng.history[-1]
    assert allocator_label("paged", snap) == "Paged (this engine)"
    assert allocator_label("paged", dataclasses.replace(snap, semantics="vllm")) == \
        "Paged (real vLLM)"
    assert "rebuilds a `vllm serve`'s prefix cache." in inspect.getsource(events)


# 16. the Watch tab's how-to and the README name the same topic; the live tree keeps its size
def test_the_live_prefix_tree_keeps_its_size_as_blocks_arrive():
    """The Watch tab redraws the tree every second: at a fixed height, a tree of 1, 10 or 300
    branches is the same size (it once grew a row at a time, moving the page), and rows keep
    their place from the top until they no longer fit."""
    from app.figures.prefix_tree import prefix_tree_figure
    from engine.kv_events.cache_view import CachedBlock

    def branches(n):                           # n one-block prefixes: n rows
        return [CachedBlock(i.to_bytes(32, "big"), None, (i,) * 4, 4, 0, "GPU", 0, i, 0.0, 1)
                for i in range(n)]
    sizes = {n: prefix_tree_figure(branches(n), height=560) for n in (0, 1, 10, 300)}
    assert {f.layout.height for f in sizes.values()} == {560}
    assert tuple(sizes[1].layout.yaxis.range) == tuple(sizes[10].layout.yaxis.range)  # in place
    assert sizes[300].layout.yaxis.range[0] >= 299                               # all shown
    assert prefix_tree_figure(branches(1)).layout.height < \
        prefix_tree_figure(branches(30)).layout.height          # elsewhere it grows with rows


def test_watch_help_and_readme_use_one_topic():
    import re
    from app.views.watch import HELP
    from .conftest import ROOT
    readme = (ROOT / "README.md").read_text()
    topics = set(re.findall(r'"topic": "([^"]+)"', readme)) | set(
        re.findall(r'"topic": "([^"]+)"', HELP))
    assert topics == {"kv"}, topics
