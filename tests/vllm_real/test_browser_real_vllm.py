"""The Engine choice "Real vLLM" in a real browser (`streamlit run app` + headless Chromium,
PAGED_LAB_REAL_VLLM=1): Step x N draws block tables equal to real vLLM's own state (the same
settings run here, in this process, through the adapter: the runs are deterministic), and the
Compare tab's agreement line reads identical. Prints how long the page took to start real vLLM
and per Step click, beside our v1 engine's, in the same run."""
from __future__ import annotations

import statistics
import time

import pytest

from app.scenarios import REAL_VLLM, SCENARIOS, preset, under_engine
from app.screenshots import (click_step, exceptions_on, free_port, launch, open_lab,
                             rendered_step, start_server, stop_server, wait_healthy,
                             wait_rendered)
from tests.app.conftest import MODEL, browser_marks

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = browser_marks()

STEPS = 5
TABLES_JS = """() => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    const t = el.layout && el.layout.title && el.layout.title.text || '';
    if (t.startsWith('Block tables') && el.offsetParent !== null)
      return {title: t, rows: el.data[0].y, text: el.data[0].text};
  }
  return null;
}"""


def drawn_tables(page) -> dict[str, list[str]]:
    fig = page.evaluate(TABLES_JS)
    assert fig is not None, "no block-table figure on the page"
    out = {}
    for label, row in zip(fig["rows"], fig["text"]):
        rid = label.split("· req ")[1].split(" ·")[0]
        out[rid] = [t.split("</b>")[0].replace("<b>", "") for t in row if t]
    return out


def test_real_vllm_on_the_page_matches_its_adapter_and_agrees_with_ours(
        vllm_ready, monkeypatch, tmp_path):
    from app.engine_build import build_engine
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path / "server.log"))
    try:
        wait_healthy(port, proc)
        with pw.sync_playwright() as p:
            ctx = launch(p)
            page = ctx.new_page()
            open_lab(page, f"http://127.0.0.1:{port}")
            ours_clicks = [click_step(page) for _ in range(STEPS)]     # the default: ours
            t0 = time.perf_counter()
            page.get_by_text("Real vLLM", exact=True).click()
            page.get_by_text("Real vLLM: real vLLM", exact=False).first.wait_for(timeout=120_000)
            wait_rendered(page, 0, 120_000)
            startup = time.perf_counter() - t0
            vllm_clicks = [click_step(page) for _ in range(STEPS)]
            assert rendered_step(page) == STEPS
            tables = drawn_tables(page)
            page.get_by_role("tab", name="Compare").click()
            line = page.get_by_text(f"Step {STEPS}: identical", exact=False).first
            line.wait_for(timeout=60_000)
            summary = page.get_by_text(f"identical for {STEPS} of {STEPS} steps",
                                       exact=False).first
            summary.wait_for(timeout=60_000)
            page.get_by_role("tab", name="Events").click()
            page.get_by_text("Real vLLM's prefix cache", exact=False).first.wait_for(
                timeout=60_000)
            assert not exceptions_on(page), exceptions_on(page)
            ctx.close()
    finally:
        stop_server(proc)
        print("\nserver log tail:\n" + "\n".join(
            (tmp_path / "server.log").read_text().splitlines()[-8:]))
    # the same settings, here, through the adapter: the drawn tables are vLLM's own
    s = under_engine(preset(SCENARIOS["single"].key, MODEL), REAL_VLLM)
    engine = build_engine(s)
    try:
        for _ in range(STEPS):
            engine.step()
        view = engine.lockstep.vllm.view()
        assert tables == {rid: [f"P{b}" for b in t] for rid, t in view.block_tables.items()}
        assert tables, "nothing drawn"
    finally:
        engine.close()
    print(f"\npage timing (one run): start real vLLM {startup:.1f} s (first start in this "
          f"server: vLLM's import included); Step click median {statistics.median(vllm_clicks):.2f} s "
          f"with real vLLM + our v1 in lockstep vs {statistics.median(ours_clicks):.2f} s "
          f"with our engine alone (the default preset, vLLM v0 rules)")


def test_a_new_tab_of_the_same_browser_takes_the_only_slot_over(vllm_ready, monkeypatch,
                                                                 tmp_path):
    """Issue 38: with PAGED_LAB_REAL_VLLM=1 a reloaded or second tab was told "Real vLLM
    already runs in 1 session(s)" for ~30 s. A tab of the same browser (one XSRF cookie) takes
    the slot over, the first tab says why when it is used again, and another browser is told
    when a slot frees."""
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path / "server.log"))
    url = f"http://127.0.0.1:{port}"

    def choose_real_vllm(page) -> None:
        page.get_by_text("Real vLLM", exact=True).click()

    try:
        wait_healthy(port, proc)
        with pw.sync_playwright() as p:
            ctx = launch(p)
            first = ctx.new_page()
            open_lab(first, url)
            choose_real_vllm(first)
            first.get_by_text("Real vLLM: real vLLM", exact=False).first.wait_for(
                timeout=120_000)
            second = ctx.new_page()                      # the same browser: its cookie
            open_lab(second, url)
            t0 = time.perf_counter()
            choose_real_vllm(second)
            second.get_by_text("Real vLLM: real vLLM", exact=False).first.wait_for(
                timeout=120_000)
            print(f"\nthe second tab got real vLLM in {time.perf_counter() - t0:.1f} s")
            assert not second.get_by_text("already runs in", exact=False).count()
            click_step(second)
            other = launch(p)                            # another browser: no hand-over
            third = other.new_page()
            open_lab(third, url)
            choose_real_vllm(third)
            refusal = third.get_by_text("already runs in 1 session(s)", exact=False).first
            refusal.wait_for(timeout=60_000)
            assert "held by an open tab" in refusal.inner_text()
            first.get_by_role("button", name="⟲ Reset").click()   # the first tab, used again
            first.get_by_text("A newer tab of this browser took over", exact=False).first \
                .wait_for(timeout=60_000)
            for page in (first, second, third):
                assert not exceptions_on(page), exceptions_on(page)
            other.close()
            ctx.close()
    finally:
        stop_server(proc)
        print("\nserver log tail:\n" + "\n".join(
            (tmp_path / "server.log").read_text().splitlines()[-8:]))
