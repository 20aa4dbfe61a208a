"""What one browser session costs Chromium, for the lab and for the smallest pages on the same
stack (outside CI): a floor for reading deploy/checks/load.py, whose browsers share the server's cores.

Pages, each served by its own `streamlit run` on 127.0.0.1 with the repository's
.streamlit/config.toml:
  bare       - a Step button and a caption in a fragment (the least a Streamlit page can be);
  one chart  - the same plus one st.plotly_chart (a 2-point scatter) that changes every Step;
  one chart, drawn in place - the same figure in a small components-v2 element that updates
               its plot with Plotly.react (the plotly package's plotly.js) instead of remounting;
  the lab    - `streamlit run app`, default preset (two figures redrawn per Step, the sidebar).
For each it prints the Chromium CPU seconds of a fresh page (a new browser context, as a new
student is: nothing cached, until the page shows step 0 and, with a chart, the chart) and of
one Step click (until the page shows the step), and the server process's CPU for each (a first
page's server CPU leaves out the first one, which loads the model), medians over a few pages
and clicks, plus the least time N fresh pages need on this machine: N x (first page CPU) /
cores.

Usage: python deploy/checks/browser_floor.py [--pages 3] [--clicks 15] [--sessions 30]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.browser import (BrowserCpu, click_step, fresh_page, launch,  # noqa: E402
                                   wait_shown)
from deploy.checks.common import ROOT, cpu_seconds, write_results  # noqa: E402

BARE = '''
import streamlit as st

def _step():
    st.session_state.n = st.session_state.get("n", 0) + 1

@st.fragment
def view():
    st.button("Step", key="step_btn", type="primary", on_click=_step)
    n = st.session_state.get("n", 0)
    CHART
    st.caption(f"rendered step {n}")

view()
'''
CHART = ('import plotly.graph_objects as go; st.plotly_chart(go.Figure(go.Scatter(x=[0, 1], '
         'y=[n, n + 1]), layout=dict(title=f"Physical block pool — step {n}")), key="chart", '
         'theme=None)')
# The same chart drawn in place: a components-v2 element (keyed, so Streamlit keeps it mounted)
# whose script keeps its plot and hands each new figure to Plotly.react, instead of a new
# st.plotly_chart mount per Step. plotly.js is the plotly package's own copy, served by a v1
# component declared on that folder. The lab does not draw this way (AppTest, and Streamlit's
# own chart features, see only st.plotly_chart); it is measured here to size what it would save.
IN_PLACE = '''
import os
import plotly
import streamlit.components.v1 as components_v1

PLOTLY_JS = components_v1.declare_component(
    "plotly_js", path=os.path.join(os.path.dirname(plotly.__file__), "package_data"))
LIVE = st.components.v2.component("floor_live_chart", isolate_styles=False, js="""
export default function ({data, parentElement}) {
  const src = new URL("component/" + data.assets + "/plotly.min.js", document.baseURI).href;
  window.__plotlyLoaded = window.__plotlyLoaded || new Promise((ok, bad) => {
    const s = document.createElement("script");
    s.src = src; s.onload = ok; s.onerror = bad; document.head.appendChild(s); });
  let div = parentElement.querySelector(".live-plot");
  if (!div) {
    div = document.createElement("div"); div.className = "live-plot"; parentElement.appendChild(div);
  }
  window.__plotlyLoaded.then(() => {
    const f = JSON.parse(data.fig);
    window.Plotly.react(div, f.data, f.layout, {displaylogo: false});
  });
}""")
'''
LIVE_CHART = ('import plotly.graph_objects as go; LIVE(key="chart", data={"assets": PLOTLY_JS.name, '
              '"fig": go.Figure(go.Scatter(x=[0, 1], y=[n, n + 1]), layout=dict(title=f"Physical '
              'block pool — step {n}")).to_json()})')
PAGES = {"bare": BARE.replace("CHART", "pass"), "one chart": BARE.replace("CHART", CHART),
         "one chart, drawn in place": BARE.replace("import streamlit as st\n",
                                                   "import streamlit as st\n" + IN_PLACE)
                                          .replace("CHART", LIVE_CHART)}


async def measure(url: str, server_pid: int, pool: bool, pages: int, clicks: int) -> dict:
    from playwright.async_api import async_playwright
    async with async_playwright() as p:
        browser = await launch(p)
        cpu = BrowserCpu()
        cpu.start()
        first, ctx = [], None
        for _ in range(pages):
            if ctx is not None:
                await ctx.close()
            ctx, page = await fresh_page(browser)
            await asyncio.sleep(0.5)
            cpu.mark()
            s0, t0 = cpu_seconds(server_pid), time.perf_counter()
            await page.goto(url, timeout=120_000)
            await wait_shown(page, 0, 120_000, pool)
            wall = time.perf_counter() - t0
            await asyncio.sleep(1.0)          # work the page still does once it shows
            first.append((cpu.seconds(), wall, cpu_seconds(server_pid) - s0))
        per_click = []
        for i in range(clicks):
            cpu.mark()
            s0 = cpu_seconds(server_pid)
            await click_step(page, i + 1, 60_000, pool)
            await asyncio.sleep(0.4)          # the update's tail (paint), then the next click
            per_click.append((cpu.seconds(), cpu_seconds(server_pid) - s0))
        cpu.stop.set()
        await browser.close()
    return {"first_page_cpu_s": statistics.median(c for c, _, _ in first),
            "first_page_wall_s": statistics.median(w for _, w, _ in first),
            "first_page_server_cpu_s": statistics.median(s for _, _, s in first[1:] or first),
            "click_cpu_s": statistics.median(c for c, _ in per_click),
            "click_server_cpu_s": statistics.median(s for _, s in per_click)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=3, help="fresh pages per kind (median; >= 1)")
    ap.add_argument("--clicks", type=int, default=15, help="Step clicks per kind (median)")
    ap.add_argument("--sessions", type=int, default=30, help="N for the least-time column")
    args = ap.parse_args()
    if args.pages < 1 or args.clicks < 1:
        ap.error("--pages and --clicks must be at least 1")

    import pandas as pd
    from app.screenshots import free_port, start_server, stop_server, wait_healthy
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / ".streamlit", work / ".streamlit")
        targets = []
        for name, text in PAGES.items():
            (work / f"{name.replace(' ', '_')}.py").write_text(text)
            targets.append((name, work, f"{name.replace(' ', '_')}.py", name != "bare"))
        targets.append(("the lab", ROOT, "app", True))
        for name, cwd, target, pool in targets:
            port = free_port()
            proc = start_server(port, script=target, cwd=cwd)
            try:
                wait_healthy(port, proc)
                r = asyncio.run(measure(f"http://127.0.0.1:{port}", proc.pid, pool, args.pages,
                                        args.clicks))
            finally:
                stop_server(proc)
            r = {"page": name, **r,
                 f"least_s_for_{args.sessions}_first_pages": args.sessions * r["first_page_cpu_s"] / cores}
            rows.append(r)
            print(pd.DataFrame([r]).to_string(index=False, float_format=lambda v: f"{v:.2f}"),
                  flush=True)
    table = pd.DataFrame(rows)
    print("\n" + table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"(Chromium CPU of all its processes; {cores} cores; the least time is the first-page "
          f"CPU of {args.sessions} fresh pages spread perfectly over every core, server not counted)")
    write_results("browser_floor", {"rows": rows, "cores": cores}, table)


if __name__ == "__main__":
    main()
