"""Sticky sessions through HAProxy: browser sessions against several Streamlit processes
(outside CI; run by hand, needs `haproxy`: apt-get install haproxy).

Starts one `streamlit run app` per `server` line of deploy/haproxy.cfg (127.0.0.1, the port
that line names) and HAProxy with that config, its frontend on a free 127.0.0.1 port. One page
per process, straight to its port, warms it up (model loaded, as deploy/checks/load.py does). Then K
Playwright browser contexts on the system Chromium go through the proxy. Each one:

1. opens the page, reads HAProxy's backend cookie, chooses a preset (round robin over the
   scenarios) and, once every session is ready, clicks Step (steps + i times for session i, so
   no two sessions expect the same count), each click waiting for the update; then checks that
   its page shows exactly its own step count and its own scenario;
2. downloads its trace from the Export tab (a /media/ file held by its process);
3. reloads the page, checks the cookie is unchanged, clicks Step once (the page still works),
   and uploads the trace it downloaded: the upload URL names the Streamlit session, and a
   process refuses a session it does not hold (HTTP 400, "without sticky sessions"), so a
   successful upload shows the page and the websocket reached the same process; it also
   passes Streamlit's XSRF check (enableXsrfProtection and enableCORS are left on).

A control session then does the same upload with its cookie switched to another server: that
one must be refused, which shows that the check can fail.

Per backend it prints the sessions its cookie named, the websockets HAProxy counted at that
server after the clicking phase, and the server process's CPU seconds (utime + stime from /proc)
over the clicking phase; overall: click -> update p50/p90, lost clicks, errors and cross-talk.
It exits 1 if a backend got no session, a session's cookie changed, an upload failed, or a
click was lost.

Usage: python deploy/checks/proxy_check.py [--sessions 6] [--steps 10]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.browser import (SIDEBAR, choose_preset, click_step,  # noqa: E402
                                   click_steps, exceptions_on, fresh_page, launch, shown_step,
                                   shows_heading, wait_shown, warm_up_page)
from deploy.checks.common import ROOT, cpu_seconds, pct  # noqa: E402
from app.screenshots import free_port, start_server, stop_server, wait_healthy  # noqa: E402

CFG = ROOT / "deploy" / "haproxy.cfg"
TRACE_BUTTON = re.compile(r"^Download trace")
TIMEOUT_MS = 120_000


def read_config(path: Path) -> tuple[str, list[dict]]:
    """HAProxy's cookie name and the servers: [{name, port, cookie}]."""
    text = path.read_text()
    cookie = re.search(r"^\s*cookie\s+(\S+)\s+insert", text, re.M).group(1)
    servers = [{"name": m[0], "port": int(m[1]), "cookie": m[2]} for m in
               re.findall(r"^\s*server\s+(\S+)\s+127\.0\.0\.1:(\d+)\s.*?cookie\s+(\S+)", text, re.M)]
    return cookie, servers


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is not in use
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def haproxy_stats(stats_port: int) -> dict[str, dict]:
    """Per server of the `streamlit` backend: scur (connections open now), stot (total)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/;csv", timeout=5) as r:
        lines = r.read().decode().splitlines()
    head = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(head, line.split(","))) for line in lines[1:] if line]
    return {r["svname"]: {"scur": int(r["scur"]), "stot": int(r["stot"]), "status": r["status"]}
            for r in rows if r["pxname"] == "streamlit" and r["svname"] != "BACKEND"}


async def backend_cookie(ctx, name: str) -> str | None:
    return next((c["value"] for c in await ctx.cookies() if c["name"] == name), None)


def describe(exc: Exception) -> str:
    """The exception's first line and the end of Playwright's call log (what it waited on)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return f"{type(exc).__name__}: " + " | ".join(lines[:1] + lines[1:][-3:])[:400]


async def keep_screenshot(page, path: Path) -> None:
    try:
        await page.screenshot(path=str(path), timeout=10_000)
    except Exception:                                  # the page may be gone
        pass


def upload_watch(page, statuses: list[int]) -> None:
    """Record the HTTP status of every file upload the page makes."""
    page.on("response", lambda r: statuses.append(r.status)
            if "/_stcore/upload_file/" in r.url and r.request.method == "PUT" else None)


async def wait_step(page, step: int) -> None:
    """Until the page's marker shows ``step`` (the pool figure is not waited for)."""
    await wait_shown(page, step, TIMEOUT_MS, pool=False)


async def upload(page, trace: str) -> None:
    await page.locator(f"{SIDEBAR} input[type=file]").set_input_files(trace)


async def session(browser, url, cookie_name, label, steps, tmp, rec, barrier):
    """One student (see the module docstring); ``barrier`` lines the sessions up before the
    clicking phase and again after it (the main task reads HAProxy's counts in between)."""
    # clicks wait for a busy server too
    ctx, page = await fresh_page(browser, TIMEOUT_MS, accept_downloads=True)
    upload_watch(page, rec["upload_statuses"])
    try:
        try:
            t0 = time.perf_counter()
            await page.goto(url)
            rec["cookies"].append(await backend_cookie(ctx, cookie_name))  # set with the page
            await wait_step(page, 0)
            rec["first_page"] = time.perf_counter() - t0
            await choose_preset(page, label, TIMEOUT_MS, pool=False)
        finally:
            await barrier.wait()                       # everyone is ready: start clicking
        await click_steps(page, steps, rec, TIMEOUT_MS, pool=False)
        rec["shown_step"] = await shown_step(page)
        rec["heading_ok"] = await shows_heading(page, label)
        rec["cookies"].append(await backend_cookie(ctx, cookie_name))
    except Exception as exc:                           # timeouts count as errors
        rec["errors"].append(describe(exc))
        await keep_screenshot(page, Path(tmp) / f"error-{rec['index']}.png")
    await barrier.wait()                               # clicking done: HAProxy's counts
    await barrier.wait()                               # ... have been read
    try:
        if rec["errors"]:
            return
        await page.get_by_role("tab", name="Export").click()
        async with page.expect_download(timeout=TIMEOUT_MS) as dl:
            await page.get_by_role("button", name=TRACE_BUTTON).click()
        trace = str(Path(tmp) / f"trace-{rec['index']}.json")
        await (await dl.value).save_as(trace)
        await page.reload()
        await page.get_by_text("rendered step", exact=False).last.wait_for(timeout=TIMEOUT_MS)
        rec["cookies"].append(await backend_cookie(ctx, cookie_name))
        await click_step(page, await shown_step(page) + 1, TIMEOUT_MS, pool=False)
        await upload(page, trace)
        await page.get_by_role("button", name="Back to the live engine").wait_for(
            timeout=TIMEOUT_MS)
        rec["reload_ok"] = True
        rec["errors"] += await exceptions_on(page)
    except Exception as exc:
        rec["errors"].append("after reload: " + describe(exc))
        await keep_screenshot(page, Path(tmp) / f"error-{rec['index']}-reload.png")
    finally:
        await ctx.close()


async def control(browser, url, cookie_name, servers, trace) -> dict:
    """A session whose cookie is switched to another server before it uploads: the upload
    reaches a process that does not hold its session and must be refused."""
    ctx, page = await fresh_page(browser, TIMEOUT_MS, accept_downloads=True)
    statuses: list[int] = []
    upload_watch(page, statuses)
    out = {"from": None, "to": None, "statuses": statuses}
    try:
        await page.goto(url)
        await wait_step(page, 0)
        out["from"] = await backend_cookie(ctx, cookie_name)
        other = next(s["cookie"] for s in servers if s["cookie"] != out["from"])
        await ctx.add_cookies([{"name": cookie_name, "value": other, "url": url}])
        out["to"] = await backend_cookie(ctx, cookie_name)
        await upload(page, trace)
        deadline = time.monotonic() + 30
        while not statuses and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        await ctx.close()
    return out


async def run(url, stats_port, cookie_name, servers, pids, n, steps, labels, tmp,
              warm_up=True):
    from playwright.async_api import async_playwright
    recs = [{"index": i, "label": labels[i % len(labels)], "want": steps + i, "latencies": [],
             "errors": [], "first_page": None, "steps": 0, "cookies": [],
             "upload_statuses": [], "reload_ok": False} for i in range(n)]
    async with async_playwright() as p:
        browser = await launch(p)
        if warm_up:
            # one page per process, straight to its port, before the sessions, so the
            # model's load is not timed as a click. Sessions arriving together at a cold
            # process once failed importing transformers (fixed: engine/models/loader.hf);
            # --no-warm-up checks that case
            for s in servers:
                await warm_up_page(browser, f"http://127.0.0.1:{s['port']}", TIMEOUT_MS,
                                   pool=False)
        barrier = asyncio.Barrier(n + 1)
        tasks = [asyncio.create_task(session(browser, url, cookie_name, r["label"], r["want"],
                                             tmp, r, barrier)) for r in recs]
        await barrier.wait()                            # all sessions ready
        cpu0 = {s["name"]: cpu_seconds(pids[s["name"]]) for s in servers}
        t0 = time.perf_counter()
        await barrier.wait()                            # all sessions clicked
        wall = time.perf_counter() - t0
        cpu = {s["name"]: cpu_seconds(pids[s["name"]]) - cpu0[s["name"]] for s in servers}
        stats = haproxy_stats(stats_port)               # the websockets still open
        await barrier.wait()
        await asyncio.gather(*tasks)
        traces = sorted(Path(tmp).glob("trace-*.json"))
        ctl = (await control(browser, url, cookie_name, servers, str(traces[0]))
               if traces else None)
        await browser.close()
    return recs, wall, cpu, stats, ctl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=6, help="browser contexts")
    ap.add_argument("--steps", type=int, default=10,
                    help="Step clicks of session 0 (session i clicks steps + i)")
    ap.add_argument("--model", default=None, help="PAGED_LAB_MODEL for the servers")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="skip the one page per process (straight to its port) before the "
                         "sessions, so they all arrive at cold processes")
    args = ap.parse_args()

    if shutil.which("haproxy") is None:
        print("haproxy not found: apt-get install haproxy", file=sys.stderr)
        return 2
    cookie_name, servers = read_config(CFG)
    if len(servers) < 2:
        print(f"{CFG.relative_to(ROOT)} names fewer than two servers", file=sys.stderr)
        return 2
    busy = [s["port"] for s in servers if not port_free(s["port"])]
    if busy:
        print(f"ports {busy} (from deploy/haproxy.cfg) are in use: stop what listens there "
              "(deploy/run_class.sh?)", file=sys.stderr)
        return 2

    from app.scenarios import SCENARIOS
    labels = [s.label for s in SCENARIOS.values()]
    version = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.split()
    front, stats_port = free_port(), free_port()
    env = {"PAGED_LAB_PROXY_BIND": f"127.0.0.1:{front}",
           "PAGED_LAB_STATS_BIND": f"127.0.0.1:{stats_port}"}
    tmp = tempfile.mkdtemp(prefix="paged-lab-proxy-")
    procs: dict[str, subprocess.Popen] = {}
    haproxy = None
    try:
        for s in servers:
            procs[s["name"]] = start_server(s["port"], args.model,
                                            log_path=f"{tmp}/{s['name']}.log")
        for s in servers:
            wait_healthy(s["port"], procs[s["name"]], timeout=120)
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(CFG)],
                                   env=dict(os.environ, **env),
                                   stdout=open(f"{tmp}/haproxy.log", "w"),
                                   stderr=subprocess.STDOUT)
        wait_healthy(front, haproxy, timeout=30)       # through the proxy
        url = f"http://127.0.0.1:{front}"
        names = ", ".join(f"{s['name']} :{s['port']}" for s in servers)
        print(f"HAProxy {version[2] if len(version) > 2 else '?'} on {url}, "
              f"{len(servers)} Streamlit processes ({names}); "
              f"{args.sessions} sessions, {args.steps}+i Step clicks each", flush=True)
        recs, wall, cpu, stats, ctl = asyncio.run(run(
            url, stats_port, cookie_name, servers, {k: p.pid for k, p in procs.items()},
            args.sessions, args.steps, labels, tmp, warm_up=not args.no_warm_up))
    finally:
        if haproxy is not None:
            stop_server(haproxy)
        for p in procs.values():
            stop_server(p)

    # ---- report ----------------------------------------------------------------------------
    by_cookie = {s["cookie"]: s["name"] for s in servers}
    rows = []
    for s in servers:
        mine = [r for r in recs if r["cookies"][:1] == [s["cookie"]]]
        clicks = sum(r["steps"] for r in mine)
        rows.append((s["name"], f":{s['port']}", len(mine), stats.get(s["name"], {}).get("scur"),
                     clicks, f"{cpu[s['name']]:.1f}",
                     f"{cpu[s['name']] / clicks:.2f}" if clicks else "-"))
    head = ("backend", "port", "sessions (cookie)", "websockets (HAProxy)", "clicks",
            "CPU s (clicking)", "CPU s/click")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(row, widths)))

    lat = [x for r in recs for x in r["latencies"]]
    clicks = sum(r["steps"] for r in recs)
    lost = sum(max(0, r["steps"] - r["shown_step"]) for r in recs if "shown_step" in r)
    cross = sum(1 for r in recs if r.get("heading_ok") is False or
                ("shown_step" in r and r["shown_step"] != r["steps"]))
    short = sum(1 for r in recs if r["steps"] < r["want"])
    errors = sum(len(r["errors"]) for r in recs)
    moved = [r["index"] for r in recs if len(set(r["cookies"])) > 1 or None in r["cookies"]]
    reload_ok = sum(r["reload_ok"] for r in recs)
    upload_ok = sum(1 for r in recs if r["upload_statuses"] and
                    all(200 <= st < 300 for st in r["upload_statuses"]))
    first = [r["first_page"] for r in recs if r["first_page"] is not None]
    print(f"clicks {clicks} in {wall:.1f} s ({clicks / wall:.2f}/s); click -> update p50 "
          f"{pct(lat, 0.5):.2f} s, p90 {pct(lat, 0.9):.2f} s, max {max(lat, default=0):.2f} s; "
          f"first page p50 {pct(first, 0.5):.1f} s")
    print(f"lost clicks {lost}, errors {errors}, cross-talk {cross}, sessions whose preset "
          f"ended before their clicks {short}")
    print(f"cookie unchanged after clicks and reload: {len(recs) - len(moved)}/{len(recs)}; "
          f"reload + Step + trace upload on the same process: {reload_ok}/{len(recs)} "
          f"(uploads accepted {upload_ok}/{len(recs)})")
    if ctl is not None:
        print(f"control: cookie switched {by_cookie.get(ctl['from'])} -> "
              f"{by_cookie.get(ctl['to'])} after the page loaded: upload HTTP "
              f"{ctl['statuses'] or 'none'} (expected 400: that process has no such session)")
    for r in recs:
        for e in r["errors"][:2]:
            print(f"  error in session {r['index']} ({r['label']}): {e}")

    problems = []
    if any(row[2] == 0 for row in rows):
        problems.append("a backend got no session")
    if moved:
        problems.append(f"sessions {moved}: the backend cookie changed or was missing")
    if lost or cross or errors:
        problems.append("lost clicks, cross-talk or errors")
    if reload_ok < len(recs) or upload_ok < len(recs):
        problems.append("a reload or an upload failed")
    if ctl is None or not ctl["statuses"] or ctl["statuses"][0] != 400:
        problems.append("the control upload (wrong backend) was not refused with 400")
    print("FAIL: " + "; ".join(problems) if problems else "OK: every session stayed on one "
          "backend and every backend served sessions")
    if problems:
        print(f"(logs kept in {tmp})")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
