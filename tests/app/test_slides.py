"""Slides export: one self-contained HTML deck (pool + block tables at projector size, each
step's whole narration) that opens offline in Chromium; no figure text is clipped, each slide
has its legends, long runs are thinned and the deck's size is known before the download."""
from __future__ import annotations

import os
import shutil

import pytest

from app.figures.slides import MAX_SLIDES, slides_deck, thin
from app.narration import narrate
from app.screenshots import CHROMIUM, launch
from app.lab import Lab

from .conftest import needs_model

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = needs_model
no_browser = (pw is None or not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)))

CLIPPED_JS = """() => {
  const out = [];
  for (const t of document.querySelectorAll('.js-plotly-plot text')) {
    if (!t.textContent.trim()) continue;
    const r = t.getBoundingClientRect();
    const svg = t.closest('svg.main-svg').getBoundingClientRect();
    if (r.left < svg.left - 1 || r.right > svg.right + 1 || r.top < svg.top - 1) out.push(t.textContent);
  }
  return out;
}"""


@pytest.fixture(scope="module")
def run():
    lab = Lab.create("mixed")
    while lab.step():
        pass
    return lab


def test_long_runs_are_thinned_evenly_keeping_the_ends():
    snaps = list(range(400))
    kept = thin(snaps)
    assert len(kept) == MAX_SLIDES and kept[0] == 0 and kept[-1] == 399
    assert thin(snaps[:50]) == snaps[:50]


def test_no_snapshots_is_a_clear_error():
    with pytest.raises(ValueError, match="no snapshots"):
        slides_deck([])


@pytest.mark.skipif(no_browser, reason="no Chromium / playwright")
def test_the_deck_opens_offline_readable_at_1280x720(run, tmp_path):
    snaps = run.snapshots()
    deck = slides_deck(snaps, run.decode, lambda s: narrate(s, None, run.decode))
    assert deck.slides == len(snaps) and f"{deck.slides} slides" in deck.summary()
    path = tmp_path / "slides.html"
    path.write_text(deck.html)
    requests = []
    with pw.sync_playwright() as p:
        ctx = launch(p, {"width": 1280, "height": 720})
        try:
            ctx.route("**/*", lambda route: (requests.append(route.request.url),
                                             route.continue_() if route.request.url.startswith("file:")
                                             else route.abort()))
            page = ctx.new_page()
            page.goto(path.as_uri())
            for i in (0, 9, 25):                   # slides with and without preemptions
                page.evaluate(f"show({i})")
                snap = snaps[i]
                page.locator(".gtitle", has_text=f"Physical block pool — step {snap.step}"
                             ).wait_for(timeout=10_000)
                assert page.locator("#text").inner_text() == narrate(snap, None, run.decode)
                assert page.evaluate(CLIPPED_JS) == [], f"slide {i}: clipped text"
                fonts = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot "
                                      "text')].filter(t => t.textContent.trim()).map(t => "
                                      "parseFloat(getComputedStyle(t).fontSize))")
                assert min(fonts) >= 18
                assert page.get_by_text("used (refcount 1)").count() >= 1      # legends
            page.keyboard.press("ArrowRight")
            page.get_by_text("slide 27 of", exact=False).wait_for(timeout=10_000)
        finally:
            ctx.close()
    assert all(u.startswith("file:") for u in requests), f"network requests: {requests}"
