"""The plot of a class load run (deploy/checks/class_load.py): click latency (p50 and p90,
and the worst click) against the number of sessions, one line per setup (one process, two
behind HAProxy) and click period, drawn with Plotly and saved as PNG by the system Chromium
(no plotting package beyond the page's own).

Usage: python deploy/checks/class_plot.py deploy/results/class_load.json [more.json ...]
       [--png docs/class-load/click-latency.png]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def setup_name(row: dict) -> str:
    procs = "1 process" if row["processes"] == 1 else f"{row['processes']} processes + HAProxy"
    return f"{procs}, a click every {row['period_s']:g} s"


def latency_figure(rows: list[dict]):
    """Click p50 / p90 (lines) and max (markers) per setup, against sessions (pure)."""
    import plotly.graph_objects as go
    fig = go.Figure()
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    setups = sorted({setup_name(r) for r in rows})
    for color, name in zip(colors, setups):
        mine = sorted((r for r in rows if setup_name(r) == name), key=lambda r: r["sessions"])
        x = [r["sessions"] for r in mine]
        for q, dash in (("p90", "solid"), ("p50", "dot")):
            fig.add_scatter(x=x, y=[r[f"click_{q}_s"] for r in mine], mode="lines+markers",
                            name=f"{name}: {q}", line=dict(color=color, dash=dash))
        fig.add_scatter(x=x, y=[r["click_max_s"] for r in mine], mode="markers",
                        name=f"{name}: max", marker=dict(color=color, symbol="x", size=9))
    # the targets as traces: a line's annotation lands off the line on a log axis
    span = [min(r["sessions"] for r in rows), max(r["sessions"] for r in rows)]
    for y, label in ((1.0, "target: p90 ≤ 1 s at 100 sessions"),
                     (0.25, "target: p90 ≤ 0.25 s at 30 sessions")):
        fig.add_scatter(x=span, y=[y, y], mode="lines", name=label,
                        line=dict(color="#999", dash="dash", width=1))
    fig.update_layout(template="plotly_white", width=900, height=520,
                      title="Step click → the server's script_finished, by sessions "
                            "(protocol-level clients, 2-core machine)",
                      xaxis_title="sessions (each clicking Step)",
                      yaxis=dict(title="seconds (log scale)", type="log"),
                      legend=dict(orientation="h", y=-0.18), margin=dict(b=150))
    return fig


async def save_png(fig, path: Path) -> None:
    from playwright.async_api import async_playwright

    from deploy.checks.browser import launch
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "plot.html"
        fig.write_html(html, include_plotlyjs=True, full_html=True)
        async with async_playwright() as p:
            browser = await launch(p)
            page = await browser.new_page(viewport={"width": 920, "height": 540})
            await page.goto(html.as_uri())
            await page.wait_for_selector(".main-svg")
            path.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(path), full_page=True)
            await browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--png", type=Path, default=Path("docs/class-load/click-latency.png"))
    args = ap.parse_args()
    rows = [r for f in args.results for r in json.loads(f.read_text())["rows"]]
    asyncio.run(save_png(latency_figure(rows), args.png))
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
