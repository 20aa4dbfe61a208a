"""Issue 38 in Chromium: what three readers saw wrong on the page, measured from the rendered SVG
(text boxes that overlap or leave their figure) and the page's own widgets; and the server's log
of the README's `streamlit run app` (its .streamlit/config.toml, no flags added) stays free of
tracebacks."""
from __future__ import annotations

import random
import threading
import time

import pytest

from app.screenshots import (click_step, exceptions_on, free_port, open_tab,
                             start_server, stop_server, wait_healthy, wait_rendered)

from engine import Engine, EngineConfig, SamplingParams

from .conftest import MODEL, browser_marks
from .test_browser import browser  # noqa: F401  (the module's Chromium, shared fixture)

try:
    import playwright.sync_api as pw
except ImportError:
    pw = None

pytestmark = browser_marks()

# every figure text's box, per figure: pairs that overlap, and texts outside their figure
LAYOUT_JS = """(title) => {
  const out = {overlaps: [], clipped: []};
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const t = plot.querySelector('.gtitle');
    if (!t || !t.textContent.includes(title)) continue;
    if (!plot.offsetParent) continue;                      // hidden (another tab)
    const svg = plot.querySelector('svg.main-svg').getBoundingClientRect();
    const boxes = [];
    for (const el of plot.querySelectorAll('text')) {
      const s = el.textContent.trim();
      if (!s) continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.left < svg.left - 1 || r.right > svg.right + 1 || r.top < svg.top - 1 ||
          r.bottom > svg.bottom + 1) out.clipped.push(s);
      boxes.push([s, r]);
    }
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const [a, p] = boxes[i], [b, q] = boxes[j];
      const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
      const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
      if (w > 1.5 && h > 1.5) out.overlaps.push(a + ' | ' + b);
    }
  }
  return out;
}"""


@pytest.fixture(scope="module")
def kv_port() -> int:
    """Where this module's engine publishes KV events; the server lets a visitor watch it."""
    return free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory, kv_port):
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    proc = start_server(port, MODEL, str(log),
                        env={"PAGED_LAB_WATCH_ENDPOINTS": f"tcp://127.0.0.1:{kv_port}"})
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop_server(proc)



def _layout(page, title: str) -> dict:
    page.mouse.move(1275, 5)
    page.wait_for_timeout(600)                              # Plotly's last redraw
    return page.evaluate(LAYOUT_JS, title)


def _open(page, url: str, query: str, step: int) -> None:
    page.goto(url + query)
    wait_rendered(page, step, 120_000)


# 2, 9: cell labels never run into each other, in the projector too; 6: legends are whole
@pytest.mark.parametrize("query, step, titles", [
    ("?scenario=mixed&step=25&projector=1", 25, ["Block tables", "Physical block pool"]),
    ("?scenario=mixed&step=25", 25, ["Block tables", "Physical block pool"]),
    ("?scenario=parallel&step=2", 2, ["Block tables", "Physical block pool"]),
    ("?scenario=parallel&step=2&projector=1", 2, ["Physical block pool"]),
    ("?scenario=prefix&step=8", 8, ["Block tables"]),
])
def test_figure_text_neither_overlaps_nor_leaves_its_figure(server, browser, query, step, titles):
    url, _ = server
    page = browser.new_page()
    _open(page, url, query, step)
    for title in titles:
        found = _layout(page, title)
        assert not found["overlaps"], f"{query}: {title}: overlapping text {found['overlaps'][:4]}"
        assert not found["clipped"], f"{query}: {title}: text cut at the edge {found['clipped']}"
    assert not exceptions_on(page)
    page.close()


# 2: the empty block table's message is whole in the projector's narrow column
def test_the_empty_state_is_whole_in_the_projector(server, browser):
    url, _ = server
    page = browser.new_page()
    _open(page, url, "?scenario=single&projector=1", 0)
    found = _layout(page, "Block tables")
    assert not found["clipped"], found["clipped"]
    page.close()


# 1: a new checkpoint's answer box is empty, in the browser too (the browser kept the old one)
def test_the_answer_box_is_empty_at_the_next_checkpoint(server, browser):
    url, _ = server
    page = browser.new_page()
    _open(page, url, "?lesson=parallel", 0)
    answered = 0
    for _ in range(6):
        nxt = page.get_by_role("button", name="Next:", exact=False)
        if not nxt.count():
            break
        nxt.first.click()
        page.wait_for_timeout(300)
        page.get_by_text("rendered step", exact=False).last.wait_for()
        box = page.get_by_placeholder("a number")
        if not box.count():
            continue
        pw.expect(box).to_have_value("", timeout=20_000)
        box.fill("4")
        box.press("Enter")
        page.get_by_role("button", name="Check").click()
        page.wait_for_timeout(800)
        answered += 1
    assert answered >= 2
    assert not exceptions_on(page)
    page.close()


# 17: the README's `streamlit run app` does not walk site-packages: no tracebacks logged
def test_the_server_log_has_no_tracebacks(server, browser):
    url, log = server
    page = browser.new_page()
    _open(page, url, "", 0)
    click_step(page)
    open_tab(page, "Text")
    page.close()
    text = log.read_text()
    assert "Traceback" not in text and "torchvision" not in text, text[-2000:]



# 2: in the projector at 1280x720 the block tables end on the first screen, their legend
#    included, and so does the pool's bottom row (mixed, step 2: five sequences, 24 blocks)
FIGURE_BOTTOMS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')]
  .filter(p => p.offsetParent)
  .map(p => {
    const title = p.querySelector('.gtitle').textContent;
    const pool = title.startsWith('Physical block pool');
    const texts = [...p.querySelectorAll(pool ? '.heatmaplayer text, g.hm text, .textpoint text'
                                              : 'text')].filter(t => t.textContent.trim());
    const cells = pool && !texts.length
      ? [...p.querySelectorAll('text')].filter(t => /^P\d/.test(t.textContent.trim())) : texts;
    return [title, Math.max(...cells.map(t => t.getBoundingClientRect().bottom))];
  })"""


def test_the_projector_shows_whole_figures_on_the_first_screen(server, browser):
    url, _ = server
    page = browser.new_page()
    _open(page, url, "?scenario=mixed&step=2&projector=1", 2)
    page.mouse.move(1275, 5)
    page.wait_for_timeout(600)
    bottoms = page.evaluate(FIGURE_BOTTOMS_JS)
    print(f"\nfigure text bottoms at 1280x720: {bottoms}")
    assert len(bottoms) == 2, bottoms
    for title, bottom in bottoms:
        assert bottom <= 720, f"{title}: its text ends at {bottom:.0f} px, below the screen"
    page.close()


@pytest.fixture
def publishing(kv_port):
    """This engine (length-only: the real block manager, no weights) publishing KV events as it
    runs: requests sharing a prefix arrive at random and finish, so the prefix tree grows and
    evictions remove blocks while the page watches."""
    eng = Engine.length_only(EngineConfig(
        block_size=4, num_gpu_blocks=64, enable_prefix_caching=True, seed=0,
        kv_events_endpoint=f"tcp://*:{kv_port}"), max_model_len=256)
    stop, rng = threading.Event(), random.Random(0)

    def drive():
        while not stop.is_set():
            if rng.random() < 0.3:
                eng.add_request(list(range(1, 9)) + [rng.randint(10, 63)
                                                     for _ in range(rng.randint(1, 9))],
                                SamplingParams(max_tokens=rng.randint(3, 12), ignore_eos=True))
            if eng.has_unfinished_requests():
                eng.step()
            stop.wait(0.15)
    t = threading.Thread(target=drive, daemon=True)
    t.start()
    yield f"tcp://127.0.0.1:{kv_port}"
    stop.set()
    t.join(timeout=10)
    eng.close()


# where each part of the live view is on the screen (elements being replaced have no box)
WATCH_PLACES_JS = """() => {
  const at = el => Math.round(el.getBoundingClientRect().top);
  const shown = el => el.getBoundingClientRect().height > 0;
  const out = {};
  for (const t of document.querySelectorAll('.gtitle'))
    if (shown(t)) out[t.textContent.split(' (')[0].split(' —')[0]] = at(t);
  const ev = [...document.querySelectorAll('p')].find(p => p.textContent.startsWith('Latest events'));
  if (ev && shown(ev)) out['Latest events'] = at(ev);
  out.scrollTop = document.querySelector('[data-testid="stMain"]').scrollTop;
  return out;
}"""


def test_the_live_view_stays_put_while_it_redraws(server, browser, publishing):
    """16: with Auto-refresh on, a reader scrolled to the charts keeps them where they are: the
    view redraws every second as batches arrive, and nothing on it changes height (the tree once
    grew a row at a time and the status line wrapped, moving all below it)."""
    url, _ = server
    page = browser.new_page()
    page.goto(url)
    page.get_by_role("tab", name="Watch vLLM").click()
    page.get_by_label("Endpoint (the server's PUB socket)").fill(publishing)
    page.get_by_role("button", name="Connect", exact=True).click()
    page.get_by_text("last batch rank 0", exact=False).first.wait_for(timeout=30_000)
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollTop = 300")
    batches, places = set(), []
    for _ in range(16):                                   # 8 s: eight redraws
        time.sleep(0.5)
        places.append(page.evaluate(WATCH_PLACES_JS))
        batches.add(page.locator('[data-testid="stMetric"]', has_text="batches")
                    .first.inner_text())
    print(f"\nplaces while redrawing: first {places[0]}, last {places[-1]}; "
          f"{len(batches)} different batch counts shown")
    assert len(batches) >= 4, f"the view did not redraw as batches arrived: {batches}"
    for part in ("Prefix cache", "Blocks stored", "Cached blocks", "Latest events",
                 "scrollTop"):
        seen = {p[part] for p in places if part in p}
        assert len(seen) == 1, f"{part} moved on the screen while the view redrew: {sorted(seen)}"
    assert not exceptions_on(page)
    page.close()
