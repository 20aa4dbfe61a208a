"""The v0 / v1 choice and the Compare view, headless (AppTest): every preset runs under both
engines, and the Compare tab shows each engine's own state side by side."""
from __future__ import annotations

import pytest

from app.compare import Comparison, compare_table
from app.scenarios import COMPARE_NOTES, SCENARIOS
from app.engine_build import build_engine
from app.scenarios import preset

from .test_page import app, chart, lab, pool_cells, step  # noqa: F401  (fixtures + helpers)
from .conftest import MODEL, needs_model

pytestmark = needs_model


def test_every_preset_runs_under_v1_on_the_page(app):
    at = app
    at.radio(key="w_semantics").set_value("v1").run()
    assert not at.exception
    for key in SCENARIOS:
        at.selectbox(key="w_scenario").set_value(key).run()
        assert not at.exception, key
        if key == "beam":       # v1 refuses beam search: the preset runs under v0, saying why
            assert any("beam search is not part of vLLM v1" in w.value for w in at.warning)
            assert at.radio(key="w_semantics").value == "v0"
            assert lab(at).engine.config.semantics == "v0" and not at.error
            step(at)
            at.radio(key="w_semantics").set_value("v1").run()      # refused again: stays v0
            assert at.radio(key="w_semantics").value == "v0"
            assert any("beam search is not part of vLLM v1" in e.value for e in at.error)
            continue
        if at.radio(key="w_semantics").value != "v1":      # after the beam preset fell back
            at.radio(key="w_semantics").set_value("v1").run()
        assert lab(at).engine.config.semantics == "v1", key
        step(at, 2)
        snap = lab(at).current()
        assert snap.semantics == "v1"
        cells = pool_cells(chart(at, "fig_pool"))
        assert cells["P0"].endswith("null")                 # block 0 drawn as the null block
        caption = " ".join(c.value for c in at.caption)
        assert "vLLM v1" in caption


def test_v1_single_sequence_chunks_its_prompt_on_the_page(app):
    at = app
    at.radio(key="w_semantics").set_value("v1").run()
    step(at)
    snap = lab(at).current()
    chunk = next(e for e in snap.events if e.kind == "prefill")
    assert chunk.end < chunk.total                  # budget 4 < the prompt: a first chunk only
    text = at.info[0].value
    assert f"tokens {chunk.start}–{chunk.end - 1} of {chunk.total}" in text


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_compare_view_renders_and_steps_for_every_preset(app, key):
    at = app
    at.selectbox(key="w_scenario").set_value(key).run()
    at.session_state["w_tab"] = "Compare"
    at.run()
    assert not at.exception
    cmp = lab(at).comparison()
    for _ in range(3):
        at.button(key="cmp_step").click().run()
        assert not at.exception
    assert COMPARE_NOTES[key][:40] in " ".join(m.value for m in at.markdown)
    for sem in ("v0", "v1"):
        snap = cmp.snapshot(sem)
        if snap is None:                               # v1 refuses the beam preset
            assert key == "beam" and sem == "v1"
            assert any("beam search" in w.value for w in at.warning)
            continue
        assert snap.step == 3 and snap.semantics == sem
        cells = pool_cells(chart(at, f"cmp_pool_{sem}"))
        used = {b.block_id: b for b in snap.blocks if b.ref_count}
        for b, block in used.items():
            assert f"rc {block.ref_count}" in cells[f"P{b}"]
    table = at.dataframe[0].value
    for sem, e in cmp.live().items():
        col = table[f"vLLM {sem}"]
        assert col["copy-on-write copies"] == str(e.event_counts.get("cow", 0))
        assert col["steps"] == str(e.snapshot.step)


def test_parallel_sampling_compare_shows_cow_in_v0_and_prefix_hits_in_v1(model):
    cmp = Comparison.build(preset("parallel", model), build_engine)
    while cmp.step():
        pass
    table = compare_table(cmp)
    v0, v1 = cmp.engines["v0"], cmp.engines["v1"]
    assert v0.event_counts["cow"] == 3 and v0.event_counts["fork"] == 3
    assert v1.event_counts.get("cow", 0) == 0 and v1.event_counts.get("fork", 0) == 0
    assert v1.event_counts["prefix_hit"] > 0
    assert table.loc["forks", "vLLM v1"] == 0 and table.loc["copy-on-write copies", "vLLM v0"] == 3
    # the same 4 samples' worth of tokens in both: n children in v1, n sequences in v0
    out0 = v0.engine.get_output("0")             # our engines, under the page wrapper
    out1 = v1.engine.get_output("0")
    assert len(out0.outputs) == len(out1.outputs) == 4
    assert all(len(c.token_ids) == 16 for c in out0.outputs + out1.outputs)


def test_metrics_csv_uses_vllms_metric_names():
    import io

    import pandas as pd

    from app.trace_io import metrics_csv
    from engine import Engine, EngineConfig, SamplingParams
    eng = Engine.length_only(EngineConfig(semantics="v1", block_size=4, num_gpu_blocks=12),
                             detailed_snapshots=True)
    prompt = list(range(4, 14))
    for _ in range(3):
        eng.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    frame = pd.read_csv(io.StringIO(metrics_csv(eng.history)))
    last = frame[frame.step == frame.step.max()].iloc[0]
    st = eng.snapshot.stats
    assert last["prefix_cache_queries"] == st.prefix_cache_queries > 0
    assert last["prefix_cache_hits"] == st.prefix_cache_hits > 0
    assert last["num_preemptions"] == st.num_preemptions > 0
    assert last["kv_cache_usage_perc"] == st.kv_cache_usage_perc


def test_the_compare_tab_steps_the_pages_own_engine_with_its_partner(app):
    """One of the two compared engines is the page's: after three Step both the narration
    above tells step 3 (not "Nothing has run yet"), and the page's Step steps the partner too."""
    at = app
    at.selectbox(key="w_scenario").set_value("parallel").run()
    at.session_state["w_tab"] = "Compare"
    at.run()
    for _ in range(3):
        at.button(key="cmp_step").click().run()
    cmp = lab(at).comparison()
    assert cmp.engines[cmp.main] is lab(at).engine and lab(at).current().step == 3
    assert at.info[0].value.startswith("Step 3 ")
    step(at)                                              # the page's Step (→)
    assert {sem: e.snapshot.step for sem, e in cmp.live().items()} == {"v0": 4, "v1": 4}
    assert "is the page's own engine" in " ".join(c.value for c in at.caption)
