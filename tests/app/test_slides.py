"""Slides export: one self-contained HTML animation of the run (pool + block tables per step)
that opens offline in Chromium, with a slider over every step."""
from __future__ import annotations

import os
import shutil

import pytest

from app.figures.slides import slides_figure, slides_html
from app.narration import narrate
from app.screenshots import CHROMIUM, launch
from app.state import Lab

from .conftest import needs_model

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = needs_model
no_browser = (pw is None or not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)))


@pytest.fixture(scope="module")
def run():
    lab = Lab.create("parallel")
    while lab.step():
        pass
    return lab


def test_one_frame_per_step_drawn_from_each_snapshot(run):
    snaps = run.snapshots()
    fig = slides_figure(snaps, run.decode)
    assert len(fig.frames) == len(snaps)
    assert [s["label"] for s in fig.layout.sliders[0].steps] == [str(s.step) for s in snaps]
    # frame 2 (first decode) shows the pool's refcounts as the snapshot has them
    snap = snaps[2]
    pool_text = " ".join(t for row in fig.frames[2].data[0].text for t in row if t)
    for b in snap.blocks:
        if b.ref_count:
            assert f"P{b.block_id}</b><br>rc {b.ref_count}" in pool_text
    rows = fig.frames[2].data[1].y
    assert len(rows) == len([s for s in snap.sequences if s.status == "running" or s.block_table])


def test_no_snapshots_is_a_clear_error():
    with pytest.raises(ValueError, match="no snapshots"):
        slides_figure([])


@pytest.mark.browser
@pytest.mark.skipif(no_browser, reason="browser test: playwright or Chromium missing")
def test_the_html_opens_offline_with_a_slider_over_every_step(run, tmp_path):
    snaps = run.snapshots()
    path = tmp_path / "slides.html"
    path.write_text(slides_html(snaps, run.decode, lambda s: narrate(s, None, run.decode)))
    requests = []
    with pw.sync_playwright() as p:
        ctx = launch(p)
        try:
            ctx.route("**/*", lambda route: (requests.append(route.request.url),
                                             route.continue_() if route.request.url.startswith("file:")
                                             else route.abort()))
            page = ctx.new_page()
            page.goto(path.as_uri())
            page.locator(".js-plotly-plot .slider-container").wait_for(timeout=30_000)
            steps = page.evaluate("document.querySelector('.js-plotly-plot').layout.sliders[0]"
                                  ".steps.map(s => s.label)")
            assert steps == [str(s.step) for s in snaps]
            # drawn: one labelled tick per step on the slider
            assert page.locator(".slider-container .slider-label-group").count() == len(snaps)
            # moving the slider shows that step's frame
            page.evaluate("Plotly.animate(document.querySelector('.js-plotly-plot'), ['2'], "
                          "{frame: {duration: 0}, transition: {duration: 0}, mode: 'immediate'})")
            page.locator(".gtitle", has_text=f"Step {snaps[2].step}").wait_for(timeout=10_000)
        finally:
            ctx.close()
    assert all(u.startswith("file:") for u in requests), f"network requests: {requests}"
