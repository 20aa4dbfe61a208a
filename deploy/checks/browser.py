"""The browser side of the hosting checks in deploy/checks/: the system Chromium, headless,
through Playwright's async API (with app.screenshots' flags), fresh pages, the page's steps
(wait until a step shows, choose a preset, click Step, read what the page shows) and the CPU
time of the Chromium processes on this machine."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from deploy.checks.common import cpu_seconds

VIEWPORT = {"width": 1280, "height": 720}
SIDEBAR = 'section[data-testid="stSidebar"]'
SETUP_TIMEOUT_MS = 300_000      # a starved browser is slow, not broken: only a real hang errs
CLICK_TIMEOUT_MS = 120_000

# Resolves once the page shows step n: the marker under the view and (``pool``) the pool
# figure's title (Plotly has drawn it). One MutationObserver in the page instead of Playwright's
# polling of text locators, which scans the whole DOM many times per click: in a one-session
# profile that polling cost Chromium ~0.17 s of CPU per click, as much as the page's own update.
# The page keeps the promise (window.__shownWaits) until it settles: V8's inspector tracks an
# awaited promise through a weak handle (explained in spaceagetv/electron-playwright-helpers#110),
# and one collected meanwhile failed a 15-session run's wait with "Resulting promise was garbage
# collected": an error of the check, not of the app.
SHOWN_JS = """([n, timeoutMs, pool = true]) => {
 const waits = window.__shownWaits = window.__shownWaits || new Set();
 const wait = new Promise((resolve, reject) => {
  const marker = 'rendered step ' + n, title = 'Physical block pool — step ' + n;
  const shown = () =>
    [...document.querySelectorAll('[data-testid="stCaptionContainer"]')].some(e => e.textContent === marker) &&
    (!pool || [...document.querySelectorAll('.gtitle')].some(e => e.textContent.startsWith(title) &&
                                                             !/[0-9]/.test(e.textContent[title.length] || '')));
  if (shown()) return resolve(true);
  const timer = setTimeout(() => { mo.disconnect(); reject(new Error(marker + ' not shown')); }, timeoutMs);
  const mo = new MutationObserver(() => { if (shown()) { clearTimeout(timer); mo.disconnect(); resolve(true); } });
  mo.observe(document.body, {subtree: true, childList: true, characterData: true});
 });
 waits.add(wait);
 wait.then(() => waits.delete(wait), () => waits.delete(wait));
 return wait;
}"""


# ---- Chromium and pages ----------------------------------------------------------------------
async def launch(playwright, executable: str | None = None):
    """Chromium (``executable``, by default the system one: app.screenshots.CHROMIUM),
    headless, with the browser tests' flags."""
    from app.screenshots import CHROMIUM, CHROMIUM_ARGS
    return await playwright.chromium.launch(executable_path=executable or CHROMIUM, headless=True,
                                            args=CHROMIUM_ARGS,
                                            ignore_default_args=["--headless=new"])


async def fresh_page(browser, timeout_ms: float = SETUP_TIMEOUT_MS, **options):
    """A new student: a fresh browser context (nothing cached) and its page, 1280x720, waiting
    up to ``timeout_ms`` by default; ``options`` go to new_context (e.g. accept_downloads)."""
    ctx = await browser.new_context(viewport=VIEWPORT, **options)
    ctx.set_default_timeout(timeout_ms)
    page = await ctx.new_page()
    return ctx, page


async def warm_up_page(browser, url: str, timeout_ms: float = SETUP_TIMEOUT_MS,
                       pool: bool = True) -> None:
    """One page until it shows step 0, then closed: that server process has loaded the model."""
    ctx, page = await fresh_page(browser, timeout_ms)
    try:
        await page.goto(url)
        await wait_shown(page, 0, timeout_ms, pool)
    finally:
        await ctx.close()


# ---- the page's steps ------------------------------------------------------------------------
async def wait_shown(page, step: int, timeout_ms: float = CLICK_TIMEOUT_MS,
                     pool: bool = True) -> None:
    """Until the page shows ``step`` (the marker and, with ``pool``, the pool figure)."""
    await page.evaluate(SHOWN_JS, [step, timeout_ms, pool])


async def choose_preset(page, label: str, timeout_ms: float = SETUP_TIMEOUT_MS,
                        pool: bool = True) -> None:
    """Pick ``label`` in the sidebar's scenario box and wait until its step 0 is drawn."""
    await page.locator(f'{SIDEBAR} [data-testid="stSelectbox"]').first.click()
    await page.get_by_role("option", name=label).click()
    await page.get_by_role("heading", name=label).wait_for(timeout=timeout_ms)
    await wait_shown(page, 0, timeout_ms, pool)


def step_button(page):
    return page.locator(".st-key-step_btn button").first


async def click_step(page, step: int, timeout_ms: float = CLICK_TIMEOUT_MS,
                     pool: bool = True) -> float:
    """Click Step (a mouse click at the button's centre: no actionability polling) and wait
    until the page shows ``step``; returns the seconds that took."""
    box = await step_button(page).bounding_box()
    t = time.perf_counter()
    await page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    await wait_shown(page, step, timeout_ms, pool)
    return time.perf_counter() - t


async def click_steps(page, steps: int, rec: dict, timeout_ms: float = CLICK_TIMEOUT_MS,
                      pool: bool = True) -> None:
    """From step 0, click Step up to ``steps`` times (until the preset finishes), each click
    waiting until the page shows the next step; latencies and the count go into ``rec``."""
    for i in range(steps):
        if await step_button(page).is_disabled():
            break                                  # the preset's requests finished
        rec["latencies"].append(await click_step(page, i + 1, timeout_ms, pool))
        rec["steps"] += 1


async def shown_step(page) -> int:
    """The step the page's marker ("rendered step N") shows."""
    text = await page.get_by_text("rendered step", exact=False).last.inner_text()
    return int(text.rsplit(" ", 1)[-1])


async def shows_heading(page, label: str) -> bool:
    """The page shows ``label``'s scenario heading, once (no other session's scenario)."""
    return await page.get_by_role("heading", name=label).count() == 1


async def exceptions_on(page) -> list[str]:
    return [await e.inner_text() for e in await page.locator('[data-testid="stException"]').all()]


# ---- Chromium's CPU --------------------------------------------------------------------------
def chromium_cpu() -> dict[int, float]:
    """utime + stime of each Chromium process on the machine (the sessions' browsers)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if "chrom" in (d / "comm").read_text():
                    out[int(d.name)] = cpu_seconds(int(d.name))
            except (OSError, ValueError, IndexError):
                pass                                   # a process that just ended
    return out


class BrowserCpu(threading.Thread):
    """Chromium CPU seconds since ``mark()``, sampled every 0.2 s so that a renderer which
    exits (a closed session) still counts with its last reading."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.mark()

    def mark(self) -> None:
        with self.lock:
            self.base = chromium_cpu()
            self.last = dict(self.base)

    def seconds(self) -> float:
        self._sample()
        with self.lock:
            return sum(v - self.base.get(pid, 0.0) for pid, v in self.last.items())

    def _sample(self) -> None:
        now = chromium_cpu()
        with self.lock:
            self.last.update(now)

    def run(self):
        while not self.stop.wait(0.2):
            self._sample()
