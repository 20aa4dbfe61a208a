"""Issue 45, finding 1, in Chromium: a trace uploaded under a name holding a Markdown link, an
image and raw HTML replays with that name as text: no <a> or <img> from it anywhere on the
page (heading, sidebar facts, caption)."""
from __future__ import annotations

import json

import pytest

from app.screenshots import (click_step, free_port, launch, open_lab, start_server,
                             stop_server, wait_healthy)

from .conftest import MODEL, browser_marks
from .test_hostile_text import HOSTILE

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = browser_marks()


def test_a_hostile_trace_name_draws_no_link_or_image(tmp_path):
    from engine import Engine, EngineConfig, SamplingParams
    from app.trace_io import trace_json
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16),
                             detailed_snapshots=True)
    eng.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=4, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    snaps = json.loads(trace_json(eng.history))
    for s in snaps:
        s["model"] = HOSTILE
    # a file name cannot hold "/": the link's target is written without it
    name = "[Log in again](https:evil.example) ![img](http:127.0.0.1:9) <img src=x> #h.json"
    trace = tmp_path / name
    trace.write_text(json.dumps(snaps))
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path / "server.log"))
    try:
        wait_healthy(port, proc)
        with pw.sync_playwright() as p:
            ctx = launch(p)
            try:
                page = ctx.new_page()
                open_lab(page, f"http://127.0.0.1:{port}")
                page.locator('section[data-testid="stSidebar"] input[type=file]') \
                    .set_input_files(str(trace))
                page.get_by_role("heading", name=f"Replay: {name}").wait_for(timeout=60_000)
                click_step(page)
                links = page.evaluate("() => [...document.querySelectorAll('a')].map("
                                      "a => a.getAttribute('href'))")
                images = page.evaluate("() => [...document.querySelectorAll('img')].map("
                                       "i => i.getAttribute('src'))")
                text = page.inner_text("body")
            finally:
                ctx.close()
    finally:
        stop_server(proc)
    assert not [h for h in links if h and ("evil" in h or "127.0.0.1:9" in h)], links
    assert not [s for s in images if s in ("x", "http:127.0.0.1:9", "http://127.0.0.1:9/i.png")]
    assert "[Log in again](https:evil.example)" in text     # shown as typed
