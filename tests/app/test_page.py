"""The page, headless (streamlit.testing.v1.AppTest): for every scenario the numbers and figures
on the page are the engine's own; bad input shows st.error and keeps the session's engine."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from streamlit.testing.v1 import AppTest

from app.figures.common import block_label
from app.narration import narrate
from app.scenarios import SCENARIOS
from app.trace_io import trace_json

from .conftest import MODEL, ROOT, needs_model

pytestmark = needs_model
STEPS = {"single": 3, "parallel": 2, "beam": 4, "prefix": 1, "mixed": 9}


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.run()
    assert not at.exception
    return at


def lab(at):
    return at.session_state["lab"]


def step(at, times=1):
    for _ in range(times):
        at.button(key="step_btn").click().run()
        assert not at.exception, at.exception


def chart(at, key):
    for el in at.get("plotly_chart"):
        if el.proto.id.endswith(key):
            return json.loads(el.proto.spec)
    raise AssertionError(f"no chart {key}")


def status_caption(at) -> str:
    """The caption under the controls: "Step **k** of n · engine · kind · state · ..."."""
    return next(c.value for c in at.caption if c.value.startswith("Step **"))


def pool_cells(spec) -> dict[str, str]:
    """cell label (P7, C3) -> its text, from the page's pool figure."""
    out = {}
    for tr in spec["data"]:
        if tr["type"] == "heatmap":
            for row in tr["text"]:
                for t in row:
                    if t:
                        out[t.replace("<b>", "").split("<")[0]] = t
    return out


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def check_page_matches_engine(at):
    eng = lab(at).engine
    snap = eng.snapshot
    prev = eng.history[-2]
    st = snap.stats
    assert f"rendered step {snap.step}" in [c.value for c in at.caption]
    assert at.info[0].value == narrate(snap, prev, lab(at).decode)
    assert metric(at, "blocks used").startswith(f"{st.used_blocks}/{st.total_blocks} ")
    assert metric(at, "shared blocks") == str(st.shared_blocks)
    assert metric(at, "backend") == eng.engine.backend_label     # our Engine, the page wraps it
    n_cow = sum(e.kind == "cow" for e in snap.events)
    assert f"**Copy-on-write copies this step: {n_cow}**" in [m.value for m in at.markdown]
    if n_cow:
        table = at.table[0].value
        assert len(table) == n_cow
        assert list(table["copy dst"]) == [block_label(e.dst) for e in snap.events if e.kind == "cow"]
    cells = pool_cells(chart(at, "fig_pool"))
    assert len([c for c in cells if c.startswith("P")]) == st.total_blocks
    for b in snap.blocks:
        text = cells[block_label(b.block_id)]
        assert (f"rc {b.ref_count}" in text) == (b.ref_count > 0 or b.state == "cached")
    drawn_cpu = [c for c in cells if c.startswith("C")]
    # the CPU swap pool is drawn where the engine swaps, or while it holds a block (issue 38)
    assert bool(drawn_cpu) == bool(snap.cpu_blocks and (
        lab(at).settings.preemption_mode == "swap" or any(b.ref_count for b in snap.cpu_blocks)))
    for b in snap.cpu_blocks if drawn_cpu else ():
        assert (f"rc {b.ref_count}" in cells[block_label(b.block_id, "cpu")]) == (b.ref_count > 0)
    tables = chart(at, "fig_tables")
    live = [s for s in snap.sequences if s.status in ("running", "waiting", "swapped") or s.block_table]
    if live:
        assert len(tables["data"][0]["y"]) == len(live)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_page_matches_engine(app, scenario):
    at = app
    if scenario != "single":
        at.selectbox(key="w_scenario").set_value(scenario).run()
    assert at.subheader[0].value == SCENARIOS[scenario].label
    assert lab(at).engine.snapshot.step == 0
    if STEPS[scenario] > 3:                          # Run N
        at.number_input(key="w_run_n").set_value(STEPS[scenario]).run()
        at.button(key="run_btn").click().run()
        assert not at.exception
    else:
        step(at, STEPS[scenario])
    assert lab(at).engine.snapshot.step == STEPS[scenario]
    check_page_matches_engine(at)
    total = Counter(e.kind for s in lab(at).engine.history for e in s.events)
    point = {"single": "alloc", "parallel": "cow", "beam": "fork", "prefix": "prefix_hit",
             "mixed": "preempt"}[scenario]
    assert total[point] >= 1, total


BAD = [("w_prompts", "   ", "prompt is empty"),
       ("w_block_size", 3, "power of two"),
       ("w_num_gpu_blocks", 1, "could never run"),
       ("w_temperature", 0.0, "set temperature > 0")]
# (the Model field is a choice among the server's models: tests/app/test_hosting.py)


def set_widget(at, key, value):
    if key == "w_prompts":
        at.text_area(key=key).input(value)
    elif key == "w_model":
        at.text_input(key=key).input(value)
    else:
        at.number_input(key=key).set_value(value)


def test_bad_input_shows_error_and_keeps_the_engine(app):
    at = app
    at.selectbox(key="w_scenario").set_value("parallel").run()
    step(at)
    engine = lab(at).engine
    for i, (key, value, words) in enumerate(BAD):
        set_widget(at, key, value)
        at.form_submit_button[0].click().run()
        assert not at.exception
        assert any(words in e.value for e in at.error), (key, [e.value for e in at.error])
        assert lab(at).engine is engine and engine.snapshot.step == 1 + i
        step(at)                                     # the page keeps working, same engine
        assert lab(at).engine is engine and engine.snapshot.step == 2 + i
        assert not at.error                          # a successful step clears the message
        set_widget(at, key, getattr(lab(at).settings, key[2:]))   # sent with the next submit
    at.form_submit_button[0].click().run()           # good settings again: a fresh engine
    assert not at.error, [e.value for e in at.error]
    assert lab(at).engine is not engine and lab(at).engine.snapshot.step == 0


def test_history_controls_tabs_and_play(app):
    at = app
    step(at, 3)
    assert "Step **3** of 3" in status_caption(at)
    at.button(key="back_btn").click().run()
    assert "Step **2** of 3" in status_caption(at)
    at.slider(key="w_hist").set_value(1).run()
    assert "Step **1** of 3" in status_caption(at)
    assert at.info[0].value.startswith("Step 1 (prefill)")
    at.button(key="latest_btn").click().run()
    assert "Step **3** of 3" in status_caption(at)
    for tab in ("Text", "Events", "Tree", "Waste", "Export", "Memory"):
        at.session_state["w_tab"] = tab
        at.run()
        assert not at.exception, tab
        if tab == "Text":
            assert any('class="seqtext"' in m.value for m in at.markdown)
        if tab in ("Events", "Tree", "Waste"):
            key = {"Events": "fig_timeline", "Tree": "fig_tree", "Waste": "fig_waste"}[tab]
            assert "step 3" in chart(at, key)["layout"]["title"]["text"]
        if tab == "Export":
            labels = [b.proto.label for b in at.get("download_button")]
            assert [x.split(" (")[0] for x in labels] == ["Download trace", "Download metrics"]
            at.button(key="slides_prepare").click().run()      # the size, before the download
            labels = [b.proto.label for b in at.get("download_button")]
            assert re.match(r"Download slides \(4 slides, \d+\.\d MB\)", labels[-1]), labels
    at.button(key="play_btn").click().run()
    assert lab(at).playing and at.button(key="play_btn").label == "⏸ Pause"
    at.button(key="play_btn").click().run()
    assert not lab(at).playing and at.button(key="play_btn").label == "▶ Play"


def test_the_history_slider_shows_step_numbers_and_reaches_every_snapshot(app):
    """The history is a slider over whole numbers (its message is the same size at any
    history length): its values are step numbers while each snapshot is the step after the one
    before, also when the first kept step is not 0 (a live history past its bound, a trace);
    positions, shown as "snapshot N", once a step number repeats (an abort records a second
    snapshot of its step), so every snapshot can still be reached."""
    at = app
    step(at, 4)
    snaps = lab(at).snapshots()
    data = trace_json(snaps[2:]).encode()                # steps 2, 3, 4
    at.sidebar.file_uploader[0].upload("later.json", data, "application/json").run()
    hist = at.slider(key="w_hist")
    assert (hist.min, hist.max, hist.value, hist.proto.format) == (2, 4, 2, "%d")
    hist.set_value(3).run()
    assert "Step **3** of 4" in status_caption(at) and lab(at).index() == 1
    at.sidebar.button[0].click().run()                   # Back to the live engine
    engine = lab(at).engine.engine                     # our Engine, under the page wrapper
    engine.abort_request(next(iter(engine.groups)))      # a second snapshot of step 4
    at.run()
    hist = at.slider(key="w_hist")
    assert (hist.min, hist.max, hist.value, hist.proto.format) == (0, 5, 5, "snapshot %d")
    assert " · abort · " in status_caption(at)
    hist.set_value(4).run()
    assert "Step **4** of 4" in status_caption(at) and lab(at).index() == 4
    assert " · abort · " not in status_caption(at)
    assert not at.exception


def test_upload_and_replay_a_trace(app):
    at = app
    step(at, 2)
    data = trace_json(lab(at).snapshots()).encode()
    at.sidebar.file_uploader[0].upload("mine.json", data, "application/json").run()
    assert not at.exception and not at.error
    assert at.subheader[0].value == "Replay: mine.json"
    assert lab(at).current().step == 0
    step(at, 2)
    assert lab(at).current().step == 2 and at.button(key="step_btn").disabled
    assert lab(at).engine.snapshot.step == 2         # replay never stepped the engine
    at.sidebar.file_uploader[0].upload("bad.json", b"{not json", "application/json").run()
    assert any("could not load bad.json" in e.value for e in at.error)
    assert at.subheader[0].value == "Replay: mine.json"          # the old replay is kept


def test_page_opens_without_a_loadable_model(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL", "/no/such/model-folder")
    monkeypatch.setenv("PAGED_LAB_MODELS", MODEL)    # the model to switch to is on the list
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=60).run()
    assert not at.exception
    assert "no such folder" in at.error[0].value
    assert "No engine yet" in at.info[0].value
    at.selectbox(key="w_model").set_value(MODEL)     # fix it in the sidebar: the lab starts
    at.form_submit_button[0].click().run()
    assert not at.error and lab(at).engine is not None
    step(at)
    assert lab(at).engine.snapshot.step == 1


def test_the_sidebar_shows_what_runs(app):
    """A refused Apply puts the running settings back in the sidebar (the error names what was
    refused); a replayed trace shows its own facts there, not the live engine's settings; under
    v1 the parallel preset's caption does not promise copy-on-write."""
    at = app
    running = lab(at).settings.block_size
    at.number_input(key="w_block_size").set_value(3)
    at.form_submit_button[0].click().run()
    assert any("power of two" in e.value for e in at.error)
    assert at.number_input(key="w_block_size").value == running
    step(at)
    data = trace_json(lab(at).snapshots()).encode()
    at.sidebar.file_uploader[0].upload("mine.json", data, "application/json").run()
    facts = " ".join(i.value for i in at.sidebar.info)
    assert "Replaying **mine.json**: 2 snapshots" in facts and "block size 4" in facts
    assert not at.sidebar.get("form")
    at.sidebar.button[0].click().run()                   # Back to the live engine
    at.selectbox(key="w_scenario").set_value("parallel").run()
    assert "copy-on-write gives" in " ".join(c.value for c in at.sidebar.caption)
    at.radio(key="w_semantics").set_value("v1").run()
    caption = " ".join(c.value for c in at.sidebar.caption)
    assert "v1 has no fork and no copy-on-write" in caption


def test_max_model_len_0_means_the_models_context(app):
    at = app
    at.number_input(key="w_max_model_len").set_value(0)
    at.form_submit_button[0].click().run()
    assert not at.error, [e.value for e in at.error]
    assert lab(at).settings.max_model_len is None and lab(at).engine.max_model_len == 1024
