"""The page in a real browser: `streamlit run app` + headless Chromium (Debian's /usr/bin/chromium
driven by the `playwright` package). Skipped, with the reason, when either is missing.

`python -m app.screenshots` (re)makes assets/screenshots/<scenario>.png with the same helpers.
"""
from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import pytest

from app.scenarios import SCENARIOS
from app.screenshots import (click_step, exceptions_on, free_port, launch, open_lab,
                             rendered_step, select_scenario, start_server, step_button,
                             stop_server, wait_healthy, wait_rendered)

from app.views.page_style import STEP_QUEUE_JS

from .conftest import MODEL, browser_marks

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = browser_marks()

RSS_BOUND_BYTES = int(1.5 * 2**30)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    proc = start_server(port, MODEL, str(log))
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_server(proc)
        print("\nserver log tail:\n" + "\n".join(log.read_text().splitlines()[-15:]))


@pytest.fixture(scope="module")
def browser():
    with pw.sync_playwright() as p:
        ctx = launch(p)
        try:
            yield ctx
        finally:
            ctx.close()


def cow_count(page) -> int:
    text = page.get_by_text("Copy-on-write copies this step:").first.inner_text()
    return int(text.rsplit(":", 1)[1])


def test_parallel_sampling_shows_copy_on_write(server, browser):
    url, _ = server
    page = browser.new_page()
    t0 = time.perf_counter()
    open_lab(page, url)
    print(f"\nfirst page ready in {time.perf_counter() - t0:.1f} s")
    select_scenario(page, SCENARIOS["parallel"].label)
    latencies, cows = [], 0
    for _ in range(8):
        latencies.append(click_step(page))
        cows = cow_count(page)
        if cows:
            break
    assert cows == 3, "n=4 on a prompt with a partial last block: 3 copies on the first decode"
    expect = pw.expect
    expect(page.locator('[data-testid="stTable"] tbody tr')).to_have_count(cows)
    pool = page.locator(".js-plotly-plot", has=page.locator(".gtitle", has_text="Physical block pool"))
    expect(pool.locator(".shapelayer path")).to_have_count(cows)       # the src -> dst arrows
    assert "Copy-on-write:" in page.locator('[data-testid="stAlertContainer"]').first.inner_text()
    for _ in range(4):                                                   # more samples for the median
        latencies.append(click_step(page))
    assert not exceptions_on(page)
    median = statistics.median(latencies)
    print(f"Step click -> figures updated: median {median:.2f} s over {len(latencies)} steps "
          f"({', '.join(f'{x:.2f}' for x in latencies)})")
    page.close()


def _open_with_max_tokens(page, url: str, max_tokens: int) -> None:
    """The default preset with another max tokens, applied (step 0 shown)."""
    open_lab(page, url)
    page.locator('section[data-testid="stSidebar"]').get_by_label(
        "max tokens", exact=True).fill(str(max_tokens))
    page.get_by_role("button", name="Apply & reset").click()
    wait_rendered(page, 0)


def _step_center(page) -> tuple[float, float]:
    box = step_button(page).bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def test_play_runs_to_the_end_and_stops(server, browser):
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 3)
    page.get_by_role("button", name="▶ Play").click()
    pw.expect(page.get_by_role("button", name="⏸ Pause")).to_be_visible(timeout=20_000)
    wait_rendered(page, 3, timeout_ms=60_000)                           # 1 step per second
    pw.expect(page.get_by_role("button", name="▶ Play")).to_be_disabled(timeout=20_000)
    pw.expect(step_button(page)).to_be_disabled()
    assert "finished" in page.get_by_text("Step 3 of 3", exact=False).first.inner_text()
    time.sleep(2.5)                                                     # the timer really stopped
    assert rendered_step(page) == 3 and not exceptions_on(page)
    page.close()


def test_five_sessions_at_once(server, browser):
    url, proc = server
    pages = {}
    rss_before = rss_bytes(proc.pid)
    for key in SCENARIOS:                               # one browser tab per scenario
        page = browser.new_page()
        open_lab(page, url)
        select_scenario(page, SCENARIOS[key].label)
        pages[key] = page
    wanted = {key: i + 1 for i, key in enumerate(SCENARIOS)}   # a different step count each
    for r in range(max(wanted.values())):               # interleaved: the server steps them together
        clicked = []
        for key, page in pages.items():
            if r < wanted[key]:
                step_button(page).click()
                clicked.append(key)
        for key in clicked:
            wait_rendered(pages[key], r + 1)
    expect = pw.expect
    for key, page in pages.items():
        assert not exceptions_on(page), key
        expect(page.get_by_role("heading", name=SCENARIOS[key].label)).to_be_visible()
        for other in SCENARIOS:
            if other != key:
                assert page.get_by_role("heading", name=SCENARIOS[other].label).count() == 0
        assert rendered_step(page) == wanted[key]
        s = SCENARIOS[key].settings
        prompts = page.locator('section[data-testid="stSidebar"] textarea').first.input_value()
        assert prompts == s.prompts
        expect(page.locator(".gtitle", has_text=f"{s.num_gpu_blocks} blocks × {s.block_size} slots")
               ).to_have_count(1)
    rss_after = rss_bytes(proc.pid)
    print(f"\nserver RSS {rss_before / 2**20:.0f} MiB -> {rss_after / 2**20:.0f} MiB with 5 sessions")
    assert rss_after - rss_before < RSS_BOUND_BYTES
    for page in pages.values():
        page.close()


def test_compare_view_steps_v0_and_v1_together(server, browser):
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    select_scenario(page, SCENARIOS["parallel"].label)
    page.get_by_role("tab", name="Compare").click()
    expect = pw.expect
    expect(page.get_by_role("heading", name="vLLM v1")).to_be_visible(timeout=60_000)
    for step in (1, 2):
        page.get_by_role("button", name="Step both").click()
        expect(page.locator(".gtitle", has_text=f"Physical block pool — step {step}")
               ).to_have_count(2, timeout=60_000)
    # step 2: v0's first decode copies on write; v1's later children hit the prefix cache
    alerts = " ".join(a.inner_text() for a in page.locator('[data-testid="stAlertContainer"]').all())
    assert "Copy-on-write:" in alerts and "Prefix cache hit:" in alerts
    expect(page.locator(".gtitle", has_text="block 0 is v1's null block")).to_have_count(1)
    assert not exceptions_on(page)
    page.close()


def _wait_past(page, step: int, timeout_s: float = 60) -> None:
    """Until the page shows a step after ``step`` (fast Play may skip any given one)."""
    deadline = time.perf_counter() + timeout_s
    while rendered_step(page) <= step:
        assert time.perf_counter() < deadline, f"Play never got past step {step}"
        time.sleep(0.05)


def _play_rate(page, seconds: float) -> float:
    """Steps per second the page shows while Play runs, over ``seconds`` (polled)."""
    first, t0 = rendered_step(page), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.05)
    return (rendered_step(page) - first) / (time.perf_counter() - t0)


def test_keyboard_shortcuts_and_play_speed(server, browser):
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 30)
    page.get_by_role("heading", name=SCENARIOS["single"].label).click()   # focus off inputs
    page.keyboard.press("ArrowRight")
    wait_rendered(page, 1)
    page.keyboard.press("ArrowRight")
    wait_rendered(page, 2)
    page.keyboard.press("ArrowLeft")                                     # back: shows step 1
    wait_rendered(page, 1)
    assert page.get_by_text("Step 1 of 2", exact=False).count() == 1
    page.keyboard.press("r")                                             # reset: a fresh engine
    wait_rendered(page, 0)
    pw.expect(page.get_by_text("Step 0 of 0", exact=False)).to_have_count(1)
    # space starts Play; at 0.5 steps/s the steps come about 2 s apart
    speed = page.get_by_role("slider", name="Play speed (steps per second)")
    speed.focus()
    page.keyboard.press("ArrowLeft")                                     # 1 -> 0.5 steps/s
    pw.expect(speed).to_have_attribute("aria-valuetext", "0.5", timeout=10_000)
    page.get_by_role("heading", name=SCENARIOS["single"].label).click()
    page.keyboard.press(" ")
    pw.expect(page.get_by_role("button", name="⏸ Pause")).to_be_visible(timeout=20_000)
    _wait_past(page, 0)
    slow = _play_rate(page, 5.0)
    page.keyboard.press(" ")                                             # space again: pause
    pw.expect(page.get_by_role("button", name="▶ Play")).to_be_visible(timeout=20_000)
    paused_at = rendered_step(page)
    time.sleep(2.5)
    assert rendered_step(page) == paused_at, "Play kept stepping after space paused it"
    for value in ("1.0", "2.0", "3.0"):                                  # 0.5 -> 1 -> 2 -> 3
        speed.focus()
        page.keyboard.press("ArrowRight")
        pw.expect(speed).to_have_attribute("aria-valuetext", value, timeout=10_000)
    page.get_by_role("heading", name=SCENARIOS["single"].label).click()
    page.keyboard.press(" ")
    _wait_past(page, paused_at)
    fast = _play_rate(page, 4.0)
    page.keyboard.press(" ")
    print(f"\nPlay: {slow:.2f} steps/s at the 0.5 setting, {fast:.2f} steps/s at the 3 setting")
    assert slow <= 0.75 and fast >= 2 * slow
    assert not exceptions_on(page)
    page.close()


def test_play_speed_changed_while_playing_takes_effect(server, browser):
    """The speed slider and Reset live in the main view's fragment, whose Play timer is set
    when the whole page runs: a speed change while Play is on must re-arm it (it once kept the
    old pace), and a Reset while playing must stop it (it once kept rerunning the view)."""
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 60)
    speed = page.get_by_role("slider", name="Play speed (steps per second)")
    speed.focus()
    page.keyboard.press("ArrowLeft")                                     # 1 -> 0.5 steps/s
    pw.expect(speed).to_have_attribute("aria-valuetext", "0.5", timeout=10_000)
    page.get_by_role("button", name="▶ Play").click()
    pw.expect(page.get_by_role("button", name="⏸ Pause")).to_be_visible(timeout=20_000)
    _wait_past(page, 0)
    slow = _play_rate(page, 5.0)
    for value in ("1.0", "2.0", "3.0"):                                  # while Play runs
        speed.focus()
        page.keyboard.press("ArrowRight")
        pw.expect(speed).to_have_attribute("aria-valuetext", value, timeout=10_000)
    _wait_past(page, rendered_step(page))
    fast = _play_rate(page, 4.0)
    print(f"\nPlay: {slow:.2f} steps/s at 0.5, then {fast:.2f} steps/s after moving to 3 "
          "while playing")
    assert slow <= 0.75 and fast >= 2 * slow, "a speed change while playing did not take effect"
    page.evaluate(RUNS_DONE_JS)
    page.get_by_role("button", name="⟲ Reset").click()                  # while playing
    wait_rendered(page, 0)
    pw.expect(page.get_by_role("button", name="▶ Play")).to_be_visible(timeout=20_000)
    time.sleep(0.5)                      # the whole-page rerun that drops the timer, if any
    runs = page.evaluate("window.__runsDone")
    time.sleep(2.5)                      # at 3 steps/s a live timer would rerun ~7 times
    assert page.evaluate("window.__runsDone") == runs, "the Play timer outlived the Reset"
    assert rendered_step(page) == 0
    assert not exceptions_on(page)
    page.close()


def test_a_released_lab_comes_back_fresh_on_a_click_in_the_view(browser, tmp_path,
                                                                  monkeypatch):
    """A Step click reruns only the main view (a fragment), while a released lab is revived by
    the whole page (get_lab): the view must hand over to it, so a student back from a break
    gets a fresh engine and the note, not "No engine yet"."""
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0.1")                  # idle after 6 s
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path / "server.log"))
    try:
        wait_healthy(port, proc)
        url = f"http://127.0.0.1:{port}"
        idle, other = browser.new_page(), browser.new_page()
        open_lab(idle, url)
        step_button(idle).click()
        wait_rendered(idle, 1)
        time.sleep(7)
        open_lab(other, url)             # a visit sweeps the other labs: the idle one goes
        step_button(idle).click()
        pw.expect(idle.get_by_text("This session was idle for more than 0.1 minutes",
                                   exact=False)).to_be_visible(timeout=30_000)
        wait_rendered(idle, 0)           # a fresh engine on the same settings
        assert idle.get_by_text("No engine yet", exact=False).count() == 0
        assert not exceptions_on(idle) and not exceptions_on(other)
        idle.close()
        other.close()
    finally:
        stop_server(proc)


def test_the_watch_view_stops_redrawing_when_auto_refresh_is_off_or_it_disconnects(server,
                                                                                    browser):
    """The live view redraws itself every second inside the main view's fragment; turning
    Auto-refresh off or pressing Disconnect must stop that timer (it once kept running).
    The server runs with the default settings: an endpoint off the operator's list is refused
    on the page, a local vLLM's default endpoint is watched."""
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    page.get_by_role("tab", name="Watch vLLM").click()
    endpoint = page.get_by_label("Endpoint (the server's PUB socket)")
    endpoint.fill("tcp://10.0.0.1:5557")
    page.get_by_role("button", name="Connect", exact=True).click()
    pw.expect(page.get_by_text("tcp://10.0.0.1:5557 in PAGED_LAB_WATCH_ENDPOINTS",
                               exact=False)).to_be_visible(timeout=10_000)
    endpoint.fill("tcp://127.0.0.1:5557")             # nothing need publish there
    page.get_by_role("button", name="Connect", exact=True).click()
    page.get_by_text("cached blocks").first.wait_for(timeout=20_000)
    page.evaluate(RUNS_DONE_JS)

    def runs_in(seconds: float) -> int:
        before = page.evaluate("window.__runsDone")
        time.sleep(seconds)
        return page.evaluate("window.__runsDone") - before
    assert runs_in(3.5) >= 2                                    # the 1 s timer redraws it
    page.get_by_text("Auto-refresh", exact=True).click()
    time.sleep(1.5)
    assert runs_in(3.5) == 0, "the live view kept redrawing with Auto-refresh off"
    page.get_by_text("Auto-refresh", exact=True).click()
    time.sleep(1.5)
    assert runs_in(3.5) >= 2
    page.get_by_role("button", name="Disconnect").click()
    pw.expect(page.get_by_text("Not watching", exact=False)).to_be_visible(timeout=10_000)
    time.sleep(1.5)
    assert runs_in(3.5) == 0, "the live view kept redrawing after Disconnect"
    assert not exceptions_on(page)
    page.close()


def test_projector_toggle_changes_the_layout_at_once(server, browser):
    """The toggle is drawn in the main view's fragment, the projector style by the whole page:
    turning it on hides the sidebar straight away, turning it off brings it back."""
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    sidebar = page.locator('section[data-testid="stSidebar"]')
    pw.expect(sidebar).to_be_visible()
    page.get_by_text("Projector", exact=True).click()
    pw.expect(sidebar).to_be_hidden(timeout=10_000)
    page.get_by_text("Projector", exact=True).click()
    pw.expect(sidebar).to_be_visible(timeout=10_000)
    assert not exceptions_on(page)
    page.close()


RUNS_DONE_JS = """() => {          // counts finished script runs (Streamlit's run state on the app)
  if (window.__runsDone !== undefined) return;
  window.__runsDone = 0;
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    if (app.dataset.testScriptState === "notRunning") window.__runsDone += 1;
  }).observe(app, {attributes: true, attributeFilter: ["data-test-script-state"]});
}"""


def _clicks(page, n: int, gap_s: float) -> None:
    """n real mouse clicks on Step, gap_s apart, without waiting for the page in between."""
    x, y = _step_center(page)
    for _ in range(n):
        page.mouse.click(x, y)
        time.sleep(gap_s)


def test_quick_clicks_are_never_lost(server, browser):
    """Streamlit merges the clicks that reach it while a rerun is running; the page's queue
    (app/views/assets/step_queue.js) sends them one at a time, so every click and → is one step."""
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 25)
    _clicks(page, 10, 0.1)                                   # 10 clicks 100 ms apart
    wait_rendered(page, 10)
    _clicks(page, 6, 0.02)                                   # 6 in quick succession
    wait_rendered(page, 16)
    page.get_by_role("heading", name=SCENARIOS["single"].label).click()   # focus off inputs
    for _ in range(4):
        page.keyboard.press("ArrowRight")
        time.sleep(0.05)
    wait_rendered(page, 20)
    time.sleep(2.0)                                          # and no step more than asked
    assert rendered_step(page) == 20
    assert page.get_by_text("Step 20 of 20", exact=False).count() == 1
    assert not exceptions_on(page)
    page.close()


# the parts of Streamlit's page the queue reads: the app's run state, the Step button, the
# view's last line; the button counts the clicks that reach it
QUEUE_PAGE = """<div data-testid="stApp" data-test-script-state="notRunning">
<div class="st-key-step_btn"><button onclick="window.sent = (window.sent || 0) + 1">Step</button></div>
<div data-testid="stCaptionContainer">rendered step 0</div></div>""" + STEP_QUEUE_JS


def test_the_click_queue_releases_a_step_whose_run_the_state_never_showed(browser):
    """A quick run can start and end within one update of the page, so Streamlit's run state
    never reads "running": the queue then lets the next click go as soon as the step is drawn,
    not after its 3 s fallback (measured before: now and then a click took 3.0-3.3 s)."""
    page = browser.new_page()
    page.set_content(QUEUE_PAGE)
    step = page.locator("button")
    step.click()                                       # sent: the queue waits for its run
    step.click()                                       # held while the first is served
    assert page.evaluate("[window.sent, window.__pagedLabStepQueue.queued]") == [1, 1]
    page.wait_for_timeout(500)                         # nothing drawn yet: still held
    assert page.evaluate("[window.sent, window.__pagedLabStepQueue.queued]") == [1, 1]
    t0 = time.perf_counter()
    page.evaluate("""document.querySelector('[data-testid="stCaptionContainer"]')
                     .textContent = 'rendered step 1'""")      # drawn; the state never changed
    page.wait_for_function("window.sent === 2", timeout=2_000)
    assert time.perf_counter() - t0 < 1.0
    # the usual way: the run state goes running -> notRunning, then the held click goes
    step.click()
    assert page.evaluate("[window.sent, window.__pagedLabStepQueue.queued]") == [2, 1]
    page.evaluate("""(() => { const a = document.querySelector('[data-testid="stApp"]');
                     a.dataset.testScriptState = 'running';
                     setTimeout(() => { a.dataset.testScriptState = 'notRunning'; }, 50); })()""")
    page.wait_for_function("window.sent === 3", timeout=2_000)
    page.close()


def _step_and_noop_latency(page, rounds: int = 10) -> tuple[list[float], list[float], int]:
    """Seconds of Step click -> the pool figure shows the step, and of a rerun that changes
    nothing (the Play speed moved one notch: the same fragment reruns, with no engine step and
    the same figures). Both are timed the same way: a plain input event, then one cheap in-page
    predicate (Step: the pool figure's new title; no-op: the run finished). A no-op run so quick
    that the browser never showed it running cannot be timed: it is counted, not used."""
    speed = page.get_by_role("slider", name="Play speed (steps per second)")
    x, y = _step_center(page)
    step_s, noop_s, unseen = [], [], 0
    for i in range(rounds):
        shown = rendered_step(page)
        t0 = time.perf_counter()
        page.mouse.click(x, y)
        page.wait_for_function(     # the update the user sees: the pool figure's new title
            f"""[...document.querySelectorAll('.gtitle')].some(
                e => e.textContent.startsWith('Physical block pool — step {shown + 1}'))""",
            timeout=60_000)
        step_s.append(time.perf_counter() - t0)
        page.wait_for_timeout(300)    # let the run end before the next input (not timed)
        done = page.evaluate("window.__runsDone")
        speed.focus()
        t0 = time.perf_counter()
        page.keyboard.press("ArrowRight" if i % 2 == 0 else "ArrowLeft")     # 1 <-> 2 steps/s
        try:
            page.wait_for_function(f"window.__runsDone > {done}", timeout=5_000)
            noop_s.append(time.perf_counter() - t0)
        except pw.Error:
            unseen += 1
    return step_s, noop_s, unseen


def test_step_costs_little_more_than_a_rerun_that_changes_nothing(server, browser):
    """Issue 14: one session on an idle machine, median Step click -> update against a rerun
    that changes nothing; the target is at most 1.5x, printed with the measured ratio (README
    and the closing note report it). The assertion is a regression bound, 2x: on this shared
    2-core machine the ratio of medians moves between about 1.2 and 1.6 from run to run."""
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    page.evaluate(RUNS_DONE_JS)
    step_s, noop_s, unseen = _step_and_noop_latency(page)
    step, noop = statistics.median(step_s), statistics.median(noop_s)
    print(f"\nStep click -> update median {step:.3f} s; rerun that changes nothing "
          f"{noop:.3f} s ({len(noop_s)} timed, {unseen} too quick to see); ratio "
          f"{step / noop:.2f} (target <= 1.5)")
    assert len(noop_s) >= 5, "too few no-op reruns could be timed"
    assert step <= 2 * noop, f"a Step costs {step / noop:.2f}x a rerun that changes nothing"
    assert not exceptions_on(page)
    page.close()


def test_keys_step_after_a_tab_click_and_walk_the_history(server, browser):
    """→ after clicking a tab steps (the tab bar does not take it); ← then → walk the recorded
    history (→ computes a new step only at its end); 5 ← presses 40 ms apart go back 5."""
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 25)
    page.get_by_role("tab", name="Text").click()                 # the tab bar has the focus
    for step in range(1, 9):
        page.keyboard.press("ArrowRight")
        _shown(page, step)
    assert page.get_by_role("tab", name="Text").get_attribute("aria-selected") == "true"
    assert page.get_by_text("Step 8 of 8", exact=False).count() == 1
    for _ in range(5):                                           # quick ←: none dropped
        page.keyboard.press("ArrowLeft")
        time.sleep(0.04)
    _shown(page, 3)
    time.sleep(1.5)
    assert rendered_step(page) == 3 and page.get_by_text("Step 3 of 8", exact=False).count() == 1
    page.keyboard.press("ArrowRight")                            # forward through the history
    _shown(page, 4)
    assert page.get_by_text("Step 4 of 8", exact=False).count() == 1
    page.get_by_role("button", name="Fwd ▶").click()
    _shown(page, 5)
    page.get_by_role("button", name="Latest ▶▶").click()
    _shown(page, 8)
    page.keyboard.press("ArrowRight")                            # at the end: a new step
    _shown(page, 9)
    assert page.get_by_text("Step 9 of 9", exact=False).count() == 1
    assert not exceptions_on(page)
    page.close()


def _shown(page, step: int) -> None:
    """Until the view's last line says ``step`` (any tab: the pool figure is on Memory only)."""
    page.get_by_text(f"rendered step {step}", exact=True).wait_for(timeout=60_000)


def test_a_400_step_export_uploads_back(server, browser, tmp_path):
    """The Export tab's trace is gzip JSON; one of 400 steps (made here with the same
    function, trace_gzip) is under the 5 MB upload limit and replays in the page."""
    from engine import Engine, EngineConfig, SamplingParams
    from app.trace_io import trace_gzip
    url, _ = server
    eng = Engine(EngineConfig(model=MODEL, block_size=8, num_gpu_blocks=128, max_history=400))
    for p in ("ROMEO:", "JULIET: Good night"):
        eng.add_request(p, SamplingParams(max_tokens=420, ignore_eos=True))
    while len(eng.history) < 400 or eng.history[0].step == 0:
        eng.step()
    long_trace = tmp_path / "long.json.gz"
    long_trace.write_bytes(trace_gzip(eng.history))
    page = browser.new_page()
    open_lab(page, url)
    click_step(page)
    page.get_by_role("tab", name="Export").click()
    with page.expect_download() as dl:
        page.get_by_role("button", name=re.compile("^Download trace")).click()
    saved = tmp_path / dl.value.suggested_filename
    dl.value.save_as(saved)
    assert saved.name.endswith(".json.gz") and saved.read_bytes()[:2] == b"\x1f\x8b"
    uploader = page.locator('section[data-testid="stSidebar"] input[type=file]')
    uploader.set_input_files(str(saved))                     # the page's own export
    page.get_by_role("heading", name=f"Replay: {saved.name}").wait_for(timeout=60_000)
    uploader.set_input_files(str(long_trace))                # 400 steps
    page.get_by_role("heading", name="Replay: long.json.gz").wait_for(timeout=120_000)
    last = eng.history[-1].step
    page.get_by_role("button", name="Latest ▶▶").click()
    page.get_by_text(f"Step {last} of {last}", exact=False).first.wait_for(timeout=60_000)
    assert not exceptions_on(page)
    page.close()


FIGURES_JS = """() => [...document.querySelectorAll('.js-plotly-plot')]
  .filter((e) => e.offsetParent !== null)
  .map((e) => ({top: e.getBoundingClientRect().top, bottom: e.getBoundingClientRect().bottom,
                minFont: Math.min(...[...e.querySelectorAll('text')]
                  .filter((t) => t.textContent.trim())
                  .map((t) => parseFloat(getComputedStyle(t).fontSize)))}))"""


@pytest.mark.parametrize("width, height", [(1280, 720), (1920, 1080)])
def test_projector_shows_the_figures_on_the_first_screen(server, browser, width, height):
    """?projector=1 at a projector's size: the Memory tab's two figures start on the first
    screen, their text is at least 18 px, and a lesson can be chosen without leaving the
    layout; its panel sits beside the figures, which stay on the first screen."""
    url, _ = server
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{url}/?projector=1")
    wait_rendered(page, 0, 90_000)
    click_step(page)
    time.sleep(1.0)
    figs = page.evaluate(FIGURES_JS)
    assert len(figs) == 2, figs
    assert all(f["top"] < 0.6 * height and f["minFont"] >= 18 for f in figs), figs
    page.locator('.st-key-w_proj_lesson [data-testid="stSelectbox"]').click()
    page.get_by_role("option", name=re.compile("^Lesson 2 · Parallel sampling")).click()
    page.get_by_role("button", name=re.compile("^Next: ")).wait_for(timeout=60_000)
    page.get_by_role("button", name=re.compile("^Next: ")).click()
    page.get_by_text("checkpoint 1 of", exact=False).wait_for(timeout=60_000)
    time.sleep(1.0)
    pw.expect(page.locator('section[data-testid="stSidebar"]')).to_be_hidden()
    figs = page.evaluate(FIGURES_JS)
    assert len(figs) == 2 and all(f["top"] < 0.6 * height for f in figs), figs
    assert not exceptions_on(page)
    page.close()


@pytest.mark.parametrize("scenario, engine, steps", [("beam", "vLLM v0", 5),
                                                     ("mixed", "vLLM v1", 14)])
def test_narration_on_the_page_follows_the_order_of_events(server, browser, scenario, engine,
                                                          steps):
    """The narration drawn after each Step is the step's events told in the order they
    happened (the same run, made here in this process, gives the events)."""
    from app.scenarios import preset, under_engine
    from app.engine_build import build_engine
    from tests.app.test_narration import _check_order
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    select_scenario(page, SCENARIOS[scenario].label)
    if engine != "vLLM v0":
        page.locator('section[data-testid="stSidebar"]').get_by_text(engine, exact=True).click()
        page.get_by_text(f"Step 0 of 0 · {engine}", exact=False).wait_for(timeout=60_000)
    sem = "v0" if engine == "vLLM v0" else "v1"
    here = build_engine(under_engine(preset(scenario, MODEL), sem))
    told = 0
    for _ in range(steps):
        click_step(page)
        here.step()
        text = page.locator('[data-testid="stAlertContainer"]').first.inner_text()
        assert text.startswith(f"Step {here.snapshot.step} ({here.snapshot.kind}): ")
        # the page's paragraph, not only ours: its sentences follow the step's events
        told += _check_order(here.snapshot, text)
        assert _check_order(here.snapshot) == _check_order(here.snapshot, text)
        for kind, words in (("preempt", "preempted"), ("cow", "Copy-on-write"),
                            ("fork", "forked into")):
            if any(e.kind == kind for e in here.snapshot.events):
                assert words in text
    assert told > steps
    assert not exceptions_on(page)
    page.close()


# ---- what a Step costs at 10 and at 1,000 recorded snapshots (issue 29) ---------------------


def _history_traces(tmp_path, long: int = 1000, short: int = 10) -> tuple[Path, Path]:
    """Two traces of the same run (one request, one token per step): its first ``short``
    snapshots and its first ``long``. A live session keeps at most app.engine_build.MAX_HISTORY (400)
    snapshots; a replay takes up to PAGED_LAB_MAX_TRACE_SNAPSHOTS (2,000 by default), so
    1,000 recorded snapshots are reached by uploading them. The steps measured are the same
    snapshots in both (positions 0 to 8): only the length of the history differs."""
    from engine import Engine, EngineConfig, SamplingParams
    from app.trace_io import trace_gzip
    eng = Engine(EngineConfig(model=MODEL, block_size=16, num_gpu_blocks=64, max_history=long))
    eng.add_request("ROMEO:", SamplingParams(max_tokens=long, ignore_eos=True))
    while len(eng.history) < long:
        assert eng.has_unfinished_requests(), "the run ended before it had enough snapshots"
        eng.step()
    history = list(eng.history)
    assert history[0].step == 0 and len(history) == long
    paths = tmp_path / f"history{short}.json.gz", tmp_path / f"history{long}.json.gz"
    paths[0].write_bytes(trace_gzip(history[:short]))
    paths[1].write_bytes(trace_gzip(history))
    return paths


def _replay(page, trace: Path) -> None:
    page.locator('section[data-testid="stSidebar"] input[type=file]').set_input_files(str(trace))
    page.get_by_role("heading", name=f"Replay: {trace.name}").wait_for(timeout=120_000)
    wait_rendered(page, 0)
    page.wait_for_timeout(500)           # the upload's run is over


def _replay_steps(page, cdp, frames: list[int], steps: int) -> dict[str, list[float]]:
    """Per Step: seconds from the click to the pool figure showing the next snapshot (one
    in-page predicate, as the Step vs no-op test), the websocket bytes the browser received
    (every ForwardMsg of the run), and Chromium's main-thread JavaScript time (Chrome's
    Performance.getMetrics ScriptDuration), both counted until the view's last line shows the
    step and 300 ms after."""
    def script_s() -> float:
        metrics = cdp.send("Performance.getMetrics")["metrics"]
        return next(m["value"] for m in metrics if m["name"] == "ScriptDuration")
    x, y = _step_center(page)
    out = {"seconds": [], "bytes": [], "script_ms": []}
    for _ in range(steps):
        shown = rendered_step(page)
        before, script0 = frames[0], script_s()
        t0 = time.perf_counter()
        page.mouse.click(x, y)
        page.wait_for_function(
            f"""[...document.querySelectorAll('.gtitle')].some(
                e => e.textContent.startsWith('Physical block pool — step {shown + 1}'))""",
            timeout=60_000)
        out["seconds"].append(time.perf_counter() - t0)
        page.get_by_text(f"rendered step {shown + 1}", exact=True).wait_for(timeout=60_000)
        page.wait_for_timeout(300)       # the run's last messages (not timed)
        out["bytes"].append(frames[0] - before)
        out["script_ms"].append(1000 * (script_s() - script0))
    return out


def test_a_step_costs_the_same_at_10_and_at_1000_recorded_snapshots(server, browser, tmp_path):
    """Issue 29: the history widget's message must not grow with the history (a select_slider
    resent one label per snapshot on every Step). One session replays two traces of the same
    run, 10 and 1,000 snapshots long, in turns (10, 1,000, 10, 1,000: a busy machine's drift
    falls on both), and Steps from the first snapshot to the ninth in each (the tenth, the
    short trace's last, would also disable Step, Fwd and Latest). At 1,000 the median Step
    click -> pool figure time and Chromium's JavaScript time per Step are at most 1.5x those
    at 10, and the bytes per Step at most 1.05x (with the select_slider they were 1.195x:
    ~25 KB at 10, ~30 KB at 1,000, so a 1.2x bound would not have caught it; the other two
    did not grow measurably: times 1.18-1.19x, JavaScript 97 and 99 ms in one run)."""
    url, _ = server
    short, long = _history_traces(tmp_path)
    page = browser.new_page()
    frames = [0]

    def on_ws(ws):
        ws.on("framereceived", lambda payload: frames.__setitem__(0, frames[0] + len(payload)))
    page.on("websocket", on_ws)
    cdp = browser.new_cdp_session(page)
    cdp.send("Performance.enable")
    open_lab(page, url)
    cost = {short: {}, long: {}}
    for trace in (short, long, short, long):
        _replay(page, trace)
        for name, values in _replay_steps(page, cdp, frames, 8).items():   # never to the end
            cost[trace].setdefault(name, []).extend(values)
        print(f"\n{trace.name}: " + ", ".join(f"{x:.3f}" for x in cost[trace]["seconds"][-8:])
              + " s", end="")
    assert not exceptions_on(page)
    cdp.detach()
    page.close()
    m10, m1k = ({name: statistics.median(v) for name, v in cost[t].items()} for t in (short, long))
    ratio = {name: m1k[name] / m10[name] for name in m10}
    print(f"\nPer Step, medians of {len(cost[short]['seconds'])}, at 10 and at 1,000 snapshots: "
          f"click -> pool figure {m10['seconds']:.3f} s, {m1k['seconds']:.3f} s (ratio "
          f"{ratio['seconds']:.2f}, bound 1.5); Chromium JavaScript {m10['script_ms']:.0f} ms, "
          f"{m1k['script_ms']:.0f} ms (ratio {ratio['script_ms']:.2f}, bound 1.5); websocket "
          f"bytes {m10['bytes']:,.0f}, {m1k['bytes']:,.0f} (ratio {ratio['bytes']:.3f}, bound "
          f"1.05)")
    assert ratio["bytes"] <= 1.05, f"a Step sends {ratio['bytes']:.2f}x the bytes at 1,000"
    assert ratio["script_ms"] <= 1.5, f"a Step runs {ratio['script_ms']:.2f}x the JavaScript"
    assert ratio["seconds"] <= 1.5, f"a Step takes {ratio['seconds']:.2f}x as long at 1,000"


def test_the_history_slider_takes_the_arrow_keys(server, browser):
    """The history slider (a plain slider over step numbers since issue 29) keeps ← and →
    while it has the focus: they move it through the recorded history, never a new step."""
    url, _ = server
    page = browser.new_page()
    _open_with_max_tokens(page, url, 25)
    for step in (1, 2, 3):
        click_step(page)
    hist = page.get_by_role("slider", name="History (step shown)")
    pw.expect(hist).to_have_attribute("aria-valuetext", "3")
    # the page's keys are taken on the window before anything else and go no further
    # (step_queue.js): the slider's reach the document
    page.evaluate("""window.__arrowsPassed = 0; document.addEventListener('keydown', (e) => {
                       if (e.key.startsWith('Arrow')) window.__arrowsPassed += 1; }, true)""")
    hist.focus()
    page.keyboard.press("ArrowLeft")
    _shown(page, 2)
    pw.expect(page.get_by_text("Step 2 of 3", exact=False)).to_have_count(1)
    page.get_by_role("slider", name="History (step shown)").focus()
    page.keyboard.press("ArrowRight")
    _shown(page, 3)
    pw.expect(page.get_by_text("Step 3 of 3", exact=False)).to_have_count(1)
    assert page.evaluate("window.__arrowsPassed") == 2, "the page took a slider's arrow key"
    assert not exceptions_on(page)
    page.close()


def test_a_refused_apply_does_not_move_the_step_button(server, browser):
    """The message of a refused Apply (lab.error) is shown below the button row, not above it:
    the Step button stays under the mouse, and the message names what was refused."""
    url, _ = server
    page = browser.new_page()
    open_lab(page, url)
    click_step(page)
    before = step_button(page).bounding_box()
    page.locator('section[data-testid="stSidebar"]').get_by_label(
        "block size", exact=True).fill("3")
    page.get_by_role("button", name="Apply & reset").click()
    error = page.locator('[data-testid="stMain"] [data-testid="stAlertContainer"]',
                         has_text="power of two")
    pw.expect(error).to_have_count(1, timeout=60_000)
    page.wait_for_timeout(500)           # the page is drawn whole
    after = step_button(page).bounding_box()
    print(f"\nStep button before a refused Apply: {before}, after: {after}")
    assert after == before, f"the Step button moved: {before} -> {after}"
    assert error.first.is_visible() and error.first.bounding_box()["y"] > before["y"]
    click_step(page)                     # a Step clears the message; the button stays put
    pw.expect(error).to_have_count(0, timeout=10_000)
    assert step_button(page).bounding_box() == before
    assert not exceptions_on(page)
    page.close()
