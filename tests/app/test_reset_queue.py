"""Issue 45, finding 6, in Chromium: Reset is ordered with the page's click queue
(app/views/assets/step_queue.js). Before, 30 quick → then r ended at "Step 25 of 25" and 30
Step clicks then Reset at "Step 15 of 15": the Steps held behind the run in flight were sent
after the Reset. Now Reset drops them and the page ends at step 0."""
from __future__ import annotations

import time

import pytest

from app.screenshots import (free_port, launch, open_lab, rendered_step, start_server,
                             step_button, stop_server, wait_healthy)

from .conftest import MODEL, browser_marks

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = browser_marks()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path_factory.mktemp("streamlit") / "server.log"))
    try:
        wait_healthy(port, proc)
        with pw.sync_playwright() as p:
            ctx = launch(p)
            try:
                page = ctx.new_page()
                open_lab(page, f"http://127.0.0.1:{port}")
                yield page
            finally:
                ctx.close()
    finally:
        stop_server(proc)


def settled_step(page, quiet_s: float = 3.0, timeout_s: float = 120.0) -> int:
    """The step shown once the page's queue is empty and nothing has run for ``quiet_s``."""
    deadline, last, since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        busy = page.evaluate("() => { const q = window.__pagedLabStepQueue; "
                             "const a = document.querySelector('[data-testid=stApp]'); "
                             "return !!q && (q.inflight || q.queued > 0) || "
                             "a.dataset.testScriptState === 'running'; }")
        step = rendered_step(page)
        if busy or step != last:
            last, since = step, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return step
        time.sleep(0.1)
    raise AssertionError(f"the page did not settle (last step {last})")


def test_reset_after_30_quick_arrow_keys_ends_at_step_0(page):
    for _ in range(30):
        page.keyboard.press("ArrowRight")
    page.keyboard.press("r")
    assert settled_step(page) == 0


def test_reset_after_30_quick_step_clicks_ends_at_step_0(page):
    box = step_button(page).bounding_box()          # the mouse, as a person clicks: quick
    for _ in range(30):                              # clicks land even while Step is busy
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.get_by_role("button", name="⟲ Reset").click()
    assert settled_step(page) == 0
