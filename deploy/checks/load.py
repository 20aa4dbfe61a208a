"""Load test: N browser sessions against one real `streamlit run app` (outside CI).

Each session is its own Playwright browser context on the system Chromium, all on 127.0.0.1.
All N open the page at once (first page: until it shows step 0 with the pool figure drawn),
then each picks a preset (round robin over the scenarios), then all click Step M times, each
click waiting until the page shows the next step (the marker under the view and the pool
figure's new title). Per N it prints: first page p50/p90, click -> update p50/p90/max, clicks
per second overall, server CPU seconds per click (the server process's utime + stime over the
clicking phase) and its share of one core, the sessions' Chromium CPU per click and per first
page, how busy the whole machine was while clicking, lost clicks (clicks minus steps the page
shows at the end), errors (exceptions on a page, timeouts), cross-talk (a page showing another
session's scenario or step count), server RSS before / peak / 30 s after the sessions closed,
and MiB per session ((peak - before) / N). RSS "cold" is read after one warm-up page (the
model's weights are loaded); "before" after one more session has stepped every preset to its
end, so what the server does once per process is not counted as the sessions' growth
(``--cold``: skip that, "before" = "cold").

Usage: python deploy/checks/load.py [--sessions 1 5 15 30] [--steps 50] [--settle 30] [--expired 150]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.browser import (SETUP_TIMEOUT_MS, BrowserCpu, choose_preset,  # noqa: E402
                                   click_steps, exceptions_on, fresh_page, launch, shown_step,
                                   shows_heading, wait_shown, warm_up_page)
from deploy.checks.common import (RssPeak, cpu_seconds, machine_busy_seconds, pct,  # noqa: E402
                                  rss_mib, write_results)


async def warm_up(browser, url, labels, steps) -> None:
    """One session steps every preset to its end, one after the other, so that what the server
    does once per process (imports, Plotly's figure classes, tokenizer caches, the heap's first
    growth) happens before RSS "before" is read, not during the measured run."""
    ctx, page = await fresh_page(browser)
    try:
        await page.goto(url)
        await wait_shown(page, 0, SETUP_TIMEOUT_MS)
        for label in labels:
            await choose_preset(page, label)
            await click_steps(page, steps, {"latencies": [], "steps": 0})
    finally:
        await ctx.close()


@contextlib.contextmanager
def noting_errors(rec: dict):
    """Run a phase of a session; an exception ends the phase and is noted in ``rec``."""
    try:
        yield
    except Exception as exc:
        rec["errors"].append(f"{type(exc).__name__}: {str(exc)[:200]}")


async def session(browser, url, label, steps, out, gates, log=lambda *a: None):
    """One student: open the page; when everyone has (``gates``: opened, choose), choose
    ``label``'s preset; when everyone has (ready, go), click Step ``steps`` times."""
    opened, choose, ready, go = gates
    rec = {"label": label, "latencies": [], "errors": [], "first_page": None, "steps": 0}
    ctx = None
    with noting_errors(rec):
        ctx, page = await fresh_page(browser)
        t0 = time.perf_counter()
        await page.goto(url)
        await wait_shown(page, 0, SETUP_TIMEOUT_MS)
        rec["first_page"] = time.perf_counter() - t0
        log("first page", label)
    opened.append(label)
    await choose.wait()
    with noting_errors(rec):
        if not rec["errors"]:
            await choose_preset(page, label)
            log("preset chosen", label)
    ready.append(label)
    await go.wait()
    with noting_errors(rec):                                   # timeouts count as errors
        if rec["errors"]:
            raise RuntimeError("not ready")
        await click_steps(page, steps, rec)
        rec["shown_step"] = await shown_step(page)
        rec["heading_ok"] = await shows_heading(page, label)
        rec["errors"] += await exceptions_on(page)
    if ctx is not None:
        await ctx.close()
    out.append(rec)


async def run_level(n, url, pid, steps, labels, chromium, log=lambda *a: None,
                    warm_presets: bool = True) -> dict:
    from playwright.async_api import async_playwright
    async with async_playwright() as p:
        browser = await launch(p, chromium)
        # warm up: one page, so the weights are loaded ("cold" RSS); then, unless --cold, one
        # session steps every preset, so "before" is a server that has done it all once
        await warm_up_page(browser, url)
        rss_cold = rss_mib(pid)
        if warm_presets:
            await warm_up(browser, url, labels, steps)
        rss_before = rss_mib(pid)
        peak = RssPeak(pid)
        peak.start()
        recs: list[dict] = []
        opened: list[str] = []
        ready: list[str] = []
        choose, go = asyncio.Event(), asyncio.Event()
        gates = (opened, choose, ready, go)

        async def everyone(arrived: list) -> None:
            while len(arrived) < n:
                await asyncio.sleep(0.1)

        bcpu = BrowserCpu()
        bcpu.start()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(session(browser, url, labels[i % len(labels)], steps, recs,
                                             gates, log)) for i in range(n)]
        await everyone(opened)             # all first pages are in (or failed)
        first_browser_cpu = bcpu.seconds()
        log(f"{n} pages open in {time.perf_counter() - t0:.1f} s; choosing presets")
        choose.set()
        await everyone(ready)              # everyone has its preset: start clicking
        log(f"{n} sessions ready; clicking")
        bcpu.mark()
        cpu0, m0, t0 = cpu_seconds(pid), machine_busy_seconds(), time.perf_counter()
        go.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        cpu, busy, browser_cpu = (cpu_seconds(pid) - cpu0, machine_busy_seconds() - m0,
                                  bcpu.seconds())
        bcpu.stop.set()
        await browser.close()
        peak.stop.set()
    return dict(recs=recs, wall=wall, cpu=cpu, browser_cpu=browser_cpu, machine_busy=busy,
                first_browser_cpu=first_browser_cpu, rss_cold=rss_cold, rss_before=rss_before,
                peak=peak.peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 5, 15, 30])
    ap.add_argument("--steps", type=int, default=50, help="Step clicks per session")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="seconds to wait after the sessions close before reading RSS again")
    ap.add_argument("--expired", type=float, default=0.0,
                    help="also read RSS this many seconds after the sessions closed (past "
                         "Streamlit's disconnectedSessionTTL, 120 s by default), e.g. 150")
    ap.add_argument("--model", default=None, help="PAGED_LAB_MODEL for the server")
    ap.add_argument("--cold", action="store_true",
                    help="read RSS \"before\" after one page only, without first stepping "
                         "every preset once in one session")
    ap.add_argument("--verbose", action="store_true", help="print each session's progress")
    args = ap.parse_args()

    import pandas as pd
    from app.scenarios import SCENARIOS
    from app.screenshots import CHROMIUM, free_port, start_server, stop_server, wait_healthy

    labels = [s.label for s in SCENARIOS.values()]
    rows = []
    for n in args.sessions:
        port = free_port()
        proc = start_server(port, args.model)
        try:
            wait_healthy(port, proc)
            url = f"http://127.0.0.1:{port}"
            level = asyncio.run(
                run_level(n, url, proc.pid, args.steps, labels, CHROMIUM,
                          log=print if args.verbose else lambda *a: None,
                          warm_presets=not args.cold))
            time.sleep(args.settle)
            rss_after = rss_mib(proc.pid)
            if args.expired:
                # Streamlit keeps a closed session's state for server.disconnectedSessionTTL
                # (default 120 s) so a student whose connection dropped gets it back
                time.sleep(max(0.0, args.expired - args.settle))
                rss_expired = rss_mib(proc.pid)
        finally:
            stop_server(proc)
        recs, wall, cpu = level["recs"], level["wall"], level["cpu"]
        rss0, peak = level["rss_before"], level["peak"]
        lat = [x for r in recs for x in r["latencies"]]
        first = [r["first_page"] for r in recs if r["first_page"] is not None]
        clicks = sum(r["steps"] for r in recs)
        lost = sum(r["steps"] - r.get("shown_step", r["steps"]) for r in recs
                   if r.get("shown_step") is not None and r["shown_step"] < r["steps"])
        # a session that saw an error on the way counts as not clean, whatever it clicked
        cross = sum(1 for r in recs if r.get("heading_ok") is False or
                    (r.get("shown_step") is not None and r["shown_step"] != r["steps"]))
        rows.append({
            "sessions": n, "first_page_p50_s": pct(first, 0.5), "first_page_p90_s": pct(first, 0.9),
            "click_p50_s": pct(lat, 0.5), "click_p90_s": pct(lat, 0.9),
            "click_max_s": max(lat) if lat else float("nan"),
            "clicks_per_s": clicks / wall if wall else float("nan"),
            "server_cpu_s_per_click": cpu / clicks if clicks else float("nan"),
            # the server's share of one core over the clicking phase: low means the browsers
            # (all on this machine) were the bottleneck, not the server
            "server_cpu_%_of_core": 100 * cpu / wall if wall else float("nan"),
            # where the rest of the machine went: the sessions' Chromium processes, per click and
            # per first page, and how busy all cores were while clicking (100% = saturated)
            "browser_cpu_s_per_click": level["browser_cpu"] / clicks if clicks else float("nan"),
            "browser_cpu_s_per_first_page": level["first_browser_cpu"] / n,
            "machine_busy_%": 100 * level["machine_busy"] / (wall * os.cpu_count())
            if wall else float("nan"),
            "clicks": clicks, "lost_clicks": lost, "errors": sum(len(r["errors"]) for r in recs),
            "cross_talk": cross, "rss_cold_mib": level["rss_cold"], "rss_before_mib": rss0,
            "rss_peak_mib": peak,
            "rss_after_mib": rss_after, "mib_per_session": (peak - rss0) / n,
            **({"rss_after_expiry_mib": rss_expired} if args.expired else {}),
        })
        print(pd.DataFrame(rows[-1:]).to_string(index=False, float_format=lambda v: f"{v:.2f}"),
              flush=True)
        for r in recs:
            for e in r["errors"][:2]:
                print(f"  error in a {r['label']!r} session: {e}")
    table = pd.DataFrame(rows)
    print("\n" + table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"(median of click latencies is per click; {args.steps} Step clicks per session; "
          f"server CPU from /proc over the clicking phase)")
    write_results("load", {"rows": rows, "steps": args.steps}, table)


if __name__ == "__main__":
    main()
