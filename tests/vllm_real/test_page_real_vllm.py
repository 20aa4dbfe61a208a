"""The Engine choice "Real vLLM" on the page (streamlit AppTest, in this process): every figure
draws real vLLM's own state, the Compare tab shows the lockstep agreement, refusals come with
a clear message before anything starts, and the choice is off unless the server turns it on."""
from __future__ import annotations

import dataclasses
import json

import pytest
from streamlit.testing.v1 import AppTest

from app.scenarios import REAL_VLLM, SCENARIOS, preset, under_engine
from app.engine_build import build_engine
from tests.app.conftest import MODEL, ROOT, needs_model

pytestmark = needs_model


@pytest.fixture
def page(monkeypatch, vllm_ready):
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "2")
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.run()
    assert not at.exception
    yield at
    lab = at.session_state["lab"]
    if lab.engine is not None:
        lab.engine.close()


def choose_real_vllm(at):
    at.radio(key="w_semantics").set_value(REAL_VLLM).run()
    assert not at.exception, at.exception
    lab = at.session_state["lab"]
    assert lab.error is None, lab.error
    assert lab.settings.real_vllm and lab.engine.__class__.__name__ == "VllmPageEngine"
    return lab


def chart(at, key):
    for el in at.get("plotly_chart"):
        if el.proto.id.endswith(key):
            return json.loads(el.proto.spec)
    raise AssertionError(f"no chart {key}")


def drawn_tables(spec) -> dict[str, list[str]]:
    """request id -> the physical blocks drawn in its row ("P5"), from the block-table figure."""
    out = {}
    for tr in spec["data"]:
        if tr["type"] == "heatmap":
            for label, row in zip(tr["y"], tr["text"]):
                rid = label.split("· req ")[1].split(" ·")[0]
                out[rid] = [t.split("</b>")[0].replace("<b>", "") for t in row if t]
    return out


def test_real_vllm_choice_draws_vllms_own_block_tables(page):
    lab = choose_real_vllm(page)
    assert lab.settings.block_size % 32 == 0          # the scenario's real-vLLM preset
    vllm = lab.engine.lockstep.vllm
    for _ in range(6):
        page.button(key="step_btn").click().run()
        assert not page.exception, page.exception
        view = vllm.view()
        drawn = drawn_tables(chart(page, "fig_tables"))
        assert drawn == {rid: [f"P{b}" for b in t] for rid, t in view.block_tables.items()}
        snap = lab.current()
        assert [b.ref_count for b in snap.blocks] == view.ref_counts
        assert snap.stats.free_blocks == len(view.free_queue)
        assert snap.semantics == REAL_VLLM and snap.backend.startswith("real vLLM")
    caption = next(c.value for c in page.caption if c.value.startswith("Step **"))
    assert "Real vLLM" in caption and "real vLLM 0." in caption


def test_compare_tab_shows_the_lockstep_agreement(page):
    lab = choose_real_vllm(page)
    for _ in range(4):
        page.button(key="step_btn").click().run()
    # the Compare tab's line (the browser test reads it on the page: AppTest draws only the
    # open tab)
    from app.views.compare import agreement_line
    assert agreement_line(lab.engine.steps, 4).startswith("**Step 4: identical**")
    assert lab.engine.summary() == "identical for 4 of 4 steps"


def test_refusals_name_the_setting_before_anything_starts(monkeypatch, vllm_ready):
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    s = under_engine(preset("single", MODEL), REAL_VLLM)
    with pytest.raises(ValueError, match="block size 8: vLLM's CPU attention needs a "
                                         "multiple of 32"):
        build_engine(s.replace(block_size=8, num_gpu_blocks=32))
    with pytest.raises(ValueError, match="max_model_len 1000"):
        build_engine(s.replace(max_model_len=1000))
    sampled = under_engine(preset("parallel", MODEL), REAL_VLLM)
    with pytest.raises(ValueError, match="temperature > 0 with a token budget per step of 64"):
        build_engine(sampled.replace(max_num_batched_tokens=64))


def test_the_choice_is_off_unless_the_server_turns_it_on(monkeypatch, vllm_ready):
    monkeypatch.delenv("PAGED_LAB_REAL_VLLM", raising=False)
    s = under_engine(preset("single", MODEL), REAL_VLLM)
    with pytest.raises(ValueError, match="PAGED_LAB_REAL_VLLM"):
        build_engine(s)


def test_sessions_beyond_the_servers_limit_are_refused(monkeypatch, vllm_ready):
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    s = under_engine(preset("single", MODEL), REAL_VLLM)
    first = build_engine(s)
    try:
        with pytest.raises(ValueError, match=r"already runs in 1 session\(s\)"):
            build_engine(s)
        again = build_engine(s, replacing=first)      # the session's own Reset
        again.close()
    finally:
        first.close()
    build_engine(s).close()                         # released: the slot is free again
