"""The plots and the table of class load runs (deploy/checks/class_load.py): click latency
(p50 and p90, and the worst click) against the number of sessions, one line per setup (one
process, several behind HAProxy) and click period, and the click p90 in each 10 s of the runs
with 60 or more sessions, drawn with Plotly and saved as PNG by the
system Chromium (no plotting package beyond the page's own); and the runs' rows as the
Markdown table of docs/hosting.md ("A class of 100").

Usage: python deploy/checks/class_plot.py deploy/results/class_load.json [more.json ...]
       [--png docs/class-load/click-latency.png]
       [--over-time-png docs/class-load/click-p90-over-time.png] [--markdown]
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


def over_time_figure(rows: list[dict]):
    """Click p90 in each 10 s of the clicking phase, one line per run that recorded it (pure):
    whether a run's p90 is a steady queue or a passing burst."""
    import plotly.graph_objects as go
    fig = go.Figure()
    for r in rows:
        p90 = r.get("click_p90_by_10s")
        if not p90:
            continue
        procs = "1 process" if r["processes"] == 1 else f"{r['processes']} processes + HAProxy"
        fig.add_scatter(x=[10 * (i + 1) for i in range(len(p90))], y=p90, mode="lines+markers",
                        name=f"{procs}, {r['sessions']} sessions every {r['period_s']:g} s "
                             f"(p90 over the run {r['click_p90_s']:.2f} s)")
    fig.add_scatter(x=[10, 10 * max((len(r.get("click_p90_by_10s") or []) for r in rows),
                                    default=1)],
                    y=[1.0, 1.0], mode="lines", name="target: p90 ≤ 1 s at 100 sessions",
                    line=dict(color="#999", dash="dash", width=1))
    fig.update_layout(template="plotly_white", width=900, height=520,
                      title="Click p90 in each 10 s of the 3 minutes of clicking",
                      xaxis_title="seconds into the clicking (end of each 10 s window)",
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


def markdown_table(rows: list[dict]) -> str:
    """One line per run, the figures the issue asks for (pure)."""
    head = ("| setup | sessions, click period | first page p50 / p90 | click p50 / p90 / max | "
            "clicks/s served (asked) | server CPU per click / per first page | "
            "RSS before → peak (MiB per session) → 60 s after | errors / cross-talk / lost |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        setup = "1 process" if r["processes"] == 1 else f"{r['processes']} + HAProxy"
        lines.append(
            f"| {setup} | {r['sessions']}, every {r['period_s']:g} s | "
            f"{r['first_page_p50_s']:.2f} / {r['first_page_p90_s']:.2f} s | "
            f"{r['click_p50_s']:.3f} / {r['click_p90_s']:.3f} / {r['click_max_s']:.2f} s | "
            f"{r['clicks_per_s']:.1f} ({r['clicks_asked_per_s']:.1f}) | "
            f"{r['server_cpu_s_per_click']:.3f} / {r['server_cpu_s_per_first_page']:.3f} s | "
            f"{r['rss_before_mib']:.0f} → {r['rss_peak_mib']:.0f} ({r['mib_per_session']:.1f}) → "
            f"{r['rss_after_mib']:.0f} MiB ({r['rss_after_vs_before_%']:+.1f} %) | "
            f"{r['errors']} / {r['cross_talk']} / {r['lost']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--png", type=Path, default=Path("docs/class-load/click-latency.png"))
    ap.add_argument("--over-time-png", type=Path,
                    default=Path("docs/class-load/click-p90-over-time.png"),
                    help="click p90 per 10 s of the runs that recorded it")
    ap.add_argument("--markdown", action="store_true", help="also print the Markdown table")
    args = ap.parse_args()
    rows = [r for f in args.results for r in json.loads(f.read_text())["rows"]]
    if args.markdown:
        print(markdown_table(rows))
    asyncio.run(save_png(latency_figure(rows), args.png))
    print(f"wrote {args.png}")
    timed = [r for r in rows if r.get("click_p90_by_10s") and r["sessions"] >= 60]
    if timed:
        asyncio.run(save_png(over_time_figure(timed), args.over_time_png))
        print(f"wrote {args.over_time_png}")


if __name__ == "__main__":
    main()
