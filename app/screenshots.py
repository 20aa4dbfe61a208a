"""Drive the page in a real browser: screenshots for the README, and helpers for the browser tests.

    python -m app.screenshots [--out assets/screenshots] [--model PATH]

starts `streamlit run app` on a free port, opens it in headless Chromium (Debian's
/usr/bin/chromium driven by the `playwright` package), runs every scenario a few steps and saves
assets/screenshots/<scenario>.png at 1280x720 (a classroom projector).
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("PAGED_LAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
                 "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1280, "height": 720}
SCREENSHOT_STEPS = {"single": 8, "parallel": 2, "beam": 9, "prefix": 1, "mixed": 9}
SCREENSHOT_VIEWPORT = {"width": 1280, "height": 1000}   # projector width; taller to show more
EXTRA_TABS = {"single": ["Text"], "parallel": ["Events"], "beam": ["Tree"], "mixed": ["Waste"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, model: str | None = None, log_path: str | None = None,
                 script: str = "app", cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """``streamlit run <script>`` on 127.0.0.1 (the lab by default; another script in ``cwd``,
    which then needs its own .streamlit/config.toml, for deploy/checks/browser_floor.py);
    ``env``: settings added to this process's environment."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    if model:
        env["PAGED_LAB_MODEL"] = model
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", script, "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false"],      # the rest from .streamlit/config.toml
        cwd=cwd or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError("streamlit did not become healthy")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def launch(playwright, viewport=VIEWPORT):
    """Headless Chromium with a fresh profile (closed-network friendly flags)."""
    profile = tempfile.mkdtemp(prefix="paged-lab-chromium-")
    return playwright.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        viewport=viewport, ignore_default_args=["--headless=new"])


# ---- page actions ----------------------------------------------------------------------------
def rendered_step(page) -> int:
    text = page.get_by_text("rendered step", exact=False).last.inner_text()
    return int(text.rsplit(" ", 1)[-1])


def wait_rendered(page, step: int, timeout_ms: float = 60_000) -> None:
    """Until the whole page (last element: the marker) and the pool figure show ``step``."""
    page.get_by_text(f"rendered step {step}", exact=True).wait_for(timeout=timeout_ms)
    # :visible: while Play reruns the view, the previous run's figure may linger hidden
    page.locator(".gtitle:visible", has_text=f"Physical block pool — step {step}").first.wait_for(
        timeout=timeout_ms)


def open_lab(page, url: str, timeout_ms: float = 90_000) -> None:
    page.goto(url)
    wait_rendered(page, 0, timeout_ms)


def select_scenario(page, label: str, timeout_ms: float = 60_000) -> None:
    page.locator('section[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name=label).click()
    page.get_by_role("heading", name=label).wait_for(timeout=timeout_ms)
    wait_rendered(page, 0, timeout_ms)


# the Step button's accessible name carries its keyboard shortcut ("Step Shortcut →")
STEP_BUTTON = re.compile(r"^Step( Shortcut →)?$")


def step_button(page):
    return page.get_by_role("button", name=STEP_BUTTON)


def click_step(page, timeout_ms: float = 60_000) -> float:
    """Click Step; seconds until the figures show the next step."""
    before = rendered_step(page)
    t0 = time.perf_counter()
    step_button(page).click()
    wait_rendered(page, before + 1, timeout_ms)
    return time.perf_counter() - t0


def exceptions_on(page) -> list[str]:
    return [e.inner_text() for e in page.locator('[data-testid="stException"]').all()]


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
    page.get_by_text(f"rendered step {rendered_step(page)}", exact=True).wait_for()
    time.sleep(1.0)                                   # let Plotly draw


def snap_page(page, path: Path) -> None:
    page.mouse.move(1275, 5)                          # no hover label over the figures
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollTo(0, 0)")
    time.sleep(0.6)
    page.screenshot(path=str(path))


def screenshot_all(url: str, out: Path, playwright) -> list[Path]:
    from app.scenarios import SCENARIOS
    out.mkdir(parents=True, exist_ok=True)
    ctx = launch(playwright, SCREENSHOT_VIEWPORT)
    saved = []
    try:
        page = ctx.new_page()
        open_lab(page, url)
        for key, scenario in SCENARIOS.items():
            select_scenario(page, scenario.label)
            for _ in range(SCREENSHOT_STEPS.get(key, 3)):
                click_step(page)
            time.sleep(1.0)
            snap_page(page, out / f"{key}.png")
            saved.append(out / f"{key}.png")
            for tab in EXTRA_TABS.get(key, []):
                open_tab(page, tab)
                snap_page(page, out / f"{key}-{tab.lower()}.png")
                saved.append(out / f"{key}-{tab.lower()}.png")
                if tab == "Waste":                    # the slot picture and the table below
                    page.locator(".stPlotlyChart").nth(1).scroll_into_view_if_needed()
                    page.mouse.move(1275, 5)
                    time.sleep(1.0)
                    page.screenshot(path=str(out / f"{key}-slots.png"))
                    saved.append(out / f"{key}-slots.png")
            open_tab(page, "Memory")
        # the mixed workload again, preempting by swapping to the CPU pool
        page.locator('section[data-testid="stSidebar"]').get_by_text("swap", exact=True).click()
        page.get_by_role("button", name="Apply & reset").click()
        wait_rendered(page, 0)
        for _ in range(SCREENSHOT_STEPS["mixed"]):
            click_step(page)
        snap_page(page, out / "mixed-swap.png")
        saved.append(out / "mixed-swap.png")
        saved += screenshot_extras(ctx, url, out)
    finally:
        ctx.close()
    return saved


def screenshot_extras(ctx, url: str, out: Path) -> list[Path]:
    """A lesson at its copy-on-write checkpoint, and the Compare view (parallel sampling)."""
    page = ctx.new_page()
    open_lab(page, url)
    sidebar = page.locator('section[data-testid="stSidebar"]')
    sidebar.get_by_text("Lessons", exact=True).click()
    page.get_by_role("button", name=re.compile("^Next: ")).wait_for(timeout=60_000)
    sidebar.locator('[data-testid="stSelectbox"]').filter(
        has=page.get_by_text("Lesson", exact=True)).click()
    page.get_by_role("option", name="2 · Parallel sampling: sharing and copy-on-write").click()
    for _ in range(2):
        page.get_by_role("button", name=re.compile("^Next: ")).click()
        page.get_by_text("checkpoint", exact=False).first.wait_for()
        time.sleep(1.5)
    page.get_by_text("Copy-on-write copies this step: 3").wait_for(timeout=60_000)
    time.sleep(1.0)
    snap_page(page, out / "lesson.png")
    page.close()
    page = ctx.new_page()
    open_lab(page, url)
    select_scenario(page, "Parallel sampling (n=4)")
    page.get_by_role("tab", name="Compare").click()
    for step in (1, 2):
        page.get_by_role("button", name="Step both").click()
        page.locator(".gtitle:visible", has_text=f"Physical block pool — step {step}").nth(1).wait_for()
    time.sleep(1.5)
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollTo(0, 420)")
    page.mouse.move(1275, 5)
    time.sleep(0.8)
    page.screenshot(path=str(out / "parallel-compare.png"))
    page.close()
    return [out / "lesson.png", out / "parallel-compare.png"]


def screenshot_real_vllm(ctx, url: str, out: Path, steps: int = 40) -> list[Path]:
    """The Engine choice "Real vLLM" (the server needs PAGED_LAB_REAL_VLLM >= 1): the shared
    prefix scenario's block tables drawn from real vLLM, and the lockstep Compare view."""
    page = ctx.new_page()
    open_lab(page, url)
    select_scenario(page, "Shared prefix (prefix caching)")
    page.get_by_text("Real vLLM", exact=True).click()
    page.get_by_text("Real vLLM: real vLLM", exact=False).first.wait_for(timeout=120_000)
    wait_rendered(page, 0, 120_000)
    for _ in range(3):
        click_step(page)
    time.sleep(1.0)
    snap_page(page, out / "real-vllm.png")
    page.get_by_role("tab", name="Compare").click()
    page.get_by_text("Step 3: identical", exact=False).first.wait_for(timeout=60_000)
    time.sleep(1.5)
    page.evaluate("document.querySelector('[data-testid=\"stMain\"]')?.scrollTo(0, 420)")
    page.mouse.move(1275, 5)
    time.sleep(0.8)
    page.screenshot(path=str(out / "real-vllm-compare.png"))
    page.close()
    return [out / "real-vllm.png", out / "real-vllm-compare.png"]


def save_with(shoot, url: str, out: Path) -> None:
    """Run ``shoot(ctx, url, out)`` (a screenshot_* function) in a fresh browser."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        ctx = launch(p, SCREENSHOT_VIEWPORT)
        try:
            for path in shoot(ctx, url, out):
                print("saved", path)
        finally:
            ctx.close()


def main_real_vllm(url: str, out: Path) -> None:
    save_with(screenshot_real_vllm, url, out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "assets" / "screenshots"))
    ap.add_argument("--model", default=os.environ.get("PAGED_LAB_MODEL"))
    ap.add_argument("--real-vllm", action="store_true",
                    help="only the real-vLLM screenshots (needs vLLM installed: "
                         "deploy/install_vllm.sh); the server runs with PAGED_LAB_REAL_VLLM=1")
    args = ap.parse_args(argv)
    if args.real_vllm:
        os.environ["PAGED_LAB_REAL_VLLM"] = "1"
    from playwright.sync_api import sync_playwright
    port = free_port()
    proc = start_server(port, args.model)
    try:
        wait_healthy(port, proc)
        if args.real_vllm:
            main_real_vllm(f"http://127.0.0.1:{port}", Path(args.out))
            return
        with sync_playwright() as p:
            for path in screenshot_all(f"http://127.0.0.1:{port}", Path(args.out), p):
                print("saved", path)
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
