"""A class on one server, measured at the protocol level (outside CI): N simulated students,
each a websocket speaking Streamlit's own messages (deploy/checks/protocol_session.py), no
browser. In a class every student brings their own browser; what the host sizes is the server,
and this measures the server alone.

Per level N (a fresh server, or ``--processes 2``: two behind HAProxy with deploy/haproxy.cfg;
more than two: a copy of it with server lines added):
1. warm-up: in each process one session steps every preset to its end (deploy/warm_up.py, as
   deploy/run_class.sh does before a class), so what a process does once (imports, Plotly's
   classes, the heap's first growth) is not counted as the students'; RSS "before";
2. join: the N sessions start at random moments within ``--join`` seconds (2); each makes a
   first visit as a browser with nothing cached does: ``GET /`` (which also carries HAProxy's
   cookie), then every other request a real Chromium made on its first visit to this server
   (recorded once per level with deploy/checks/browser.py: scripts, styles, fonts, health and
   host config; 6 at a time, Chromium's limit per host) while the page runs once over the
   websocket: session start -> the last of those and the first run's ``script_finished``
   (``--assets none``: the websocket only, as for a browser with everything cached);
3. each picks a preset (round robin over the scenarios), then clicks Step every ``--period``
   seconds (2, with +-25 % jitter) for ``--duration`` seconds (180). A click due while the
   previous one is still served waits for it (the page's click queue, app/views/assets/
   step_queue.js, does the same) and is timed from when it was due to its ``script_finished``.
   When a preset's run ends (Step disabled) the session presses Reset and goes on;
4. every run's elements are read: an ``exception`` element or a run that did not finish is an
   error; a run whose step marker, pool figure or scenario heading is not this session's own is
   cross-talk; a click whose run does not show one step more is lost;
5. the sessions leave (websockets closed); RSS is read ``--settle`` seconds later (60).

The Streamlit processes run as deploy/run_class.sh runs them (MALLOC_ARENA_MAX=2; other
settings with ``--server-env``). Server CPU from /proc (the Streamlit processes and HAProxy), over the clicking phase and over
the join; RSS summed over the Streamlit processes. The client's own CPU is printed too (it shares the machine).

Usage: python deploy/checks/class_load.py [--sessions 1 10 30 60 100] [--period 2]
       [--duration 180] [--processes 1|2|3...] [--out NAME]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.common import (RssPeak, cpu_seconds, machine_busy_seconds, pct,  # noqa: E402
                                  rss_mib, write_results)
from deploy.checks.protocol_session import ProtocolSession, RunSeen  # noqa: E402
from deploy.warm_up import warm_up  # noqa: E402

CFG = Path(__file__).resolve().parents[1] / "haproxy.cfg"
JITTER = 0.25                          # a click's gap is the period +- 25 %


class Servers:
    """One `streamlit run app`, or ``processes`` of them behind HAProxy (deploy/haproxy.cfg)."""

    def __init__(self, processes: int, env: dict[str, str]):
        from app.screenshots import free_port
        self.tmp = tempfile.mkdtemp(prefix="paged-lab-class-")
        self.env, self.procs, self.haproxy = env, [], None
        self.cfg = CFG
        if processes == 1:
            self.ports = [free_port()]
        else:
            from deploy.checks.proxy_check import read_config
            self.ports = [s["port"] for s in read_config(CFG)[1]][:processes]
            if len(self.ports) < processes:               # more than deploy/ ships: a copy
                self.cfg, self.ports = more_servers(CFG, processes, Path(self.tmp))
            self.front = free_port()

    def __enter__(self) -> "Servers":
        from app.screenshots import free_port, start_server, wait_healthy
        saved = dict(os.environ)
        os.environ.update(self.env)
        try:
            for i, port in enumerate(self.ports):
                self.procs.append(start_server(port, log_path=f"{self.tmp}/st{i + 1}.log"))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        for port, proc in zip(self.ports, self.procs):
            wait_healthy(port, proc, timeout=120)
        if len(self.ports) > 1:
            if shutil.which("haproxy") is None:
                raise SystemExit("haproxy not found: apt-get install haproxy")
            bind = {"PAGED_LAB_PROXY_BIND": f"127.0.0.1:{self.front}",
                    "PAGED_LAB_STATS_BIND": f"127.0.0.1:{free_port()}"}
            self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(self.cfg)],
                                            env=dict(os.environ, **bind),
                                            stdout=open(f"{self.tmp}/haproxy.log", "w"),
                                            stderr=subprocess.STDOUT)
            wait_healthy(self.front, self.haproxy, timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        from app.screenshots import stop_server
        for p in ([self.haproxy] if self.haproxy else []) + self.procs:
            stop_server(p)

    @property
    def url(self) -> str:
        port = self.ports[0] if len(self.ports) == 1 else self.front
        return f"http://127.0.0.1:{port}"

    def cpu(self) -> float:
        """CPU seconds of the Streamlit processes and HAProxy (the server side, all of it)."""
        return sum(cpu_seconds(p.pid) for p in self.procs + ([self.haproxy] if self.haproxy
                                                              else []))

    def rss(self) -> float:
        return sum(rss_mib(p.pid) for p in self.procs)


def more_servers(cfg: Path, processes: int, tmp: Path) -> tuple[Path, list[int]]:
    """A copy of ``cfg`` with ``server`` lines added (the next ports, as its comment says
    to add one by hand) up to ``processes``; its path and the ports."""
    lines = cfg.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if line.strip().startswith("server "))
    ports = [int(p) for p in re.findall(r"^\s*server\s+\S+\s+127\.0\.0\.1:(\d+)",
                                         cfg.read_text(), re.M)]
    while len(ports) < processes:
        k = len(ports) + 1
        ports.append(ports[-1] + 1)
        last += 1
        lines.insert(last, f"    server st{k} 127.0.0.1:{ports[-1]} cookie st{k}")
    path = tmp / "haproxy.cfg"
    path.write_text("\n".join(lines) + "\n")
    return path, ports


class SummedRssPeak:
    """The peak of the servers' summed RSS (one RssPeak per process is not the peak of the sum
    but bounds it; the sum of peaks is what is reported, an upper bound)."""

    def __init__(self, pids):
        self.threads = [RssPeak(pid) for pid in pids]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for t in self.threads:
            t.stop.set()

    @property
    def peak(self) -> float:
        return sum(t.peak for t in self.threads)


def page_cookie(url: str) -> str:
    """``GET /`` as a browser does before it opens the websocket; the cookie it was given
    (HAProxy's backend cookie behind the proxy, else none)."""
    with urllib.request.urlopen(url + "/", timeout=120) as r:
        r.read()
        cookies = r.headers.get_all("Set-Cookie") or []
    return "; ".join(c.split(";", 1)[0] for c in cookies)


async def first_visit_paths(url: str) -> list[str]:
    """The paths a fresh Chromium context requests from the server on its first visit, until
    the page shows step 0 with the pool drawn (the document and the websocket left out)."""
    from playwright.async_api import async_playwright

    from deploy.checks.browser import fresh_page, launch, wait_shown
    paths: list[str] = []

    def seen(request) -> None:
        if (request.method == "GET" and request.url.startswith(url)
                and request.resource_type not in ("document", "websocket")):
            paths.append(request.url[len(url):])
    async with async_playwright() as p:
        browser = await launch(p)
        ctx, page = await fresh_page(browser)
        page.on("request", seen)
        await page.goto(url)
        await wait_shown(page, 0)
        await ctx.close()
        await browser.close()
    return paths


async def fetch_all(url: str, paths: list[str], cookie: str, connections: int = 6) -> int:
    """GET every path over ``connections`` kept-alive HTTP/1.1 connections (Chromium's limit
    per host), one request at a time on each, as a browser does; the bytes received. A status
    other than 200 raises. Plain asyncio streams, not an HTTP library: a first visit is ~125
    requests, and a library's per-request cost made the client use more CPU than the server
    it measures (aiohttp: 0.061 s per first visit against the servers' 0.043 s, measured)."""
    host, port = url.removeprefix("http://").split(":")
    extra = f"Cookie: {cookie}\r\n" if cookie else ""
    queue = list(reversed(paths))
    got = 0

    async def worker() -> None:
        nonlocal got
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while queue:
                path = queue.pop()
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                             f"Accept-Encoding: gzip, deflate, br, zstd\r\n{extra}\r\n"
                             .encode())
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                status = head.split(" ", 2)[1]
                fields = {k.strip().lower(): v.strip() for k, _, v in
                          (line.partition(":") for line in head.split("\r\n")[1:] if line)}
                # the body read first, then added: ``got += await …`` reads ``got`` before the
                # await, so two workers' bodies arriving together lost one (a total of 4 bytes
                # for nine responses, seen under load)
                if "content-length" in fields:
                    body = await reader.readexactly(int(fields["content-length"]))
                    got += len(body)
                else:                                        # chunked
                    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                        chunk = await reader.readexactly(size + 2)
                        got += len(chunk) - 2
                    await reader.readuntil(b"\r\n")
                if status != "200":
                    raise RuntimeError(f"GET {path}: HTTP {status}")
        finally:
            writer.close()
    await asyncio.gather(*(worker() for _ in range(min(connections, len(paths)))))
    return got


class Student:
    """One simulated session and what it measured."""

    def __init__(self, url: str, label: str, assets: list[str]):
        self.url, self.label, self.assets = url, label, assets
        self.first_page: float | None = None
        self.latencies: list[float] = []
        self.dues: list[float] = []            # when each timed click was due (perf_counter)
        self.backend = ""                      # HAProxy's cookie value: which process serves it
        self.errors: list[str] = []
        self.cross_talk: list[str] = []
        self.clicks = self.served = self.lost = self.resets = 0
        self.step = 0
        self.session: ProtocolSession | None = None

    def check(self, run: RunSeen, step: int | None, labels: list[str]) -> None:
        """Errors and cross-talk in one run's elements: it shows this session's step (when
        ``step`` is given) and scenario heading, and no other scenario's."""
        if run.exceptions:
            self.errors += run.exceptions
        if step is not None and run.step is not None and run.step != step:
            self.cross_talk.append(f"marker shows step {run.step}, expected {step}")
        if step is not None and run.pool_step is not None and run.pool_step != step:
            self.cross_talk.append(f"pool figure shows step {run.pool_step}, expected {step}")
        others = [x for x in run.headings if x in labels and x != self.label]
        if others:
            self.cross_talk.append(f"heading {others[0]!r} in a {self.label!r} session")

    async def join(self, delay: float) -> None:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        try:
            cookie = await asyncio.to_thread(page_cookie, self.url)
            self.backend = cookie.partition("=")[2]
            self.session = ProtocolSession(self.url, cookie=cookie)
            run, _ = await asyncio.gather(self.session.first_page(t0),
                                          fetch_all(self.url, self.assets, cookie))
            self.first_page = time.perf_counter() - t0
            self.check(run, 0, [])
        except Exception as exc:
            self.errors.append(f"first page: {type(exc).__name__}: {exc}"[:300])

    async def choose(self, labels: list[str]) -> None:
        if self.session is None or self.first_page is None:
            return
        try:
            run = await self.session.choose("w_scenario", self.label)
            self.check(run, 0, labels)
            if self.label not in run.headings:
                self.errors.append(f"preset {self.label!r} not shown after choosing it")
        except Exception as exc:
            self.errors.append(f"choose: {type(exc).__name__}: {exc}"[:300])

    async def click_for(self, period: float, until: float, labels: list[str]) -> None:
        """Click Step every ``period`` s (+- jitter) until ``until``; Reset when the run ends."""
        if self.session is None or self.first_page is None:
            return
        due = time.perf_counter() + random.uniform(0, period)
        while due < until:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            try:
                if self.session.disabled.get("step_btn"):        # the preset's run ended
                    run = await self.session.click("reset_btn")
                    self.resets += 1
                    self.step = 0
                    self.check(run, 0, labels)
                self.clicks += 1
                run = await self.session.click("step_btn")
                self.latencies.append(time.perf_counter() - due)
                self.dues.append(due)
                self.served += 1
                self.check(run, None, labels)
                if run.step == self.step + 1:
                    self.step += 1
                elif run.step is not None and run.step <= self.step:
                    self.lost += 1                               # the click did not step
                else:
                    self.check(run, self.step + 1, labels)
                    self.step = run.step if run.step is not None else self.step
            except Exception as exc:
                self.errors.append(f"click: {type(exc).__name__}: {exc}"[:300])
                return
            due += period * random.uniform(1 - JITTER, 1 + JITTER)
            due = max(due, time.perf_counter() - period)         # no burst of overdue clicks

    async def leave(self) -> None:
        if self.session is not None:
            await self.session.close()


class LoopLag:
    """How late the client's own event loop wakes up: a task asks to sleep 50 ms again and
    again and records the oversleep. The client shares the machine with the servers; a click's
    time includes the client's lateness in sending it and reading the answer, so this says how
    much of a latency could be the client's own (a browser elsewhere would not have it)."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.late, self.task = interval, [], None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.late.append(time.perf_counter() - t - self.interval)

    def __enter__(self) -> "LoopLag":
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        self.task.cancel()


async def run_level(servers: Servers, n: int, period: float, duration: float, join: float,
                    labels: list[str], settle: float, assets: bool, log) -> dict:
    url = servers.url
    for port in servers.ports:              # every process, each on its own port
        await warm_up(f"http://127.0.0.1:{port}")
    paths = await first_visit_paths(url) if assets else []
    log(f"a first visit requests {len(paths)} paths besides the page and its websocket")
    rss_before = servers.rss()
    students = [Student(url, labels[i % len(labels)], paths) for i in range(n)]
    with SummedRssPeak([p.pid for p in servers.procs]) as peak:
        cpu0, client0, t0 = servers.cpu(), time.process_time(), time.perf_counter()
        await asyncio.gather(*(s.join(random.uniform(0, join)) for s in students))
        join_wall, join_cpu = time.perf_counter() - t0, servers.cpu() - cpu0
        join_client_cpu = time.process_time() - client0
        log(f"{n} joined in {join_wall:.1f} s")
        await asyncio.gather(*(s.choose(labels) for s in students))
        cpu0, client0, busy0 = servers.cpu(), time.process_time(), machine_busy_seconds()
        t0 = time.perf_counter()
        with LoopLag() as lag:
            await asyncio.gather(*(s.click_for(period, t0 + duration, labels)
                                   for s in students))
        wall = time.perf_counter() - t0
        cpu, client_cpu = servers.cpu() - cpu0, time.process_time() - client0
        busy = machine_busy_seconds() - busy0
        rss_peak = peak.peak
    await asyncio.gather(*(s.leave() for s in students))
    log(f"left; reading RSS in {settle:.0f} s")
    left, rss_trace = time.perf_counter(), []          # (seconds after leaving, MiB)
    while (waited := time.perf_counter() - left) < settle:
        rss_trace.append((round(waited, 1), round(servers.rss(), 1)))
        await asyncio.sleep(min(5.0, settle - waited))
    rss_after = servers.rss()
    rss_trace.append((round(time.perf_counter() - left, 1), round(rss_after, 1)))
    first = [s.first_page for s in students if s.first_page is not None]
    by_window = over_time(students, t0, duration)
    process = {s: s.backend or "st1" for s in students}      # one process: no HAProxy cookie
    by_process = {b: [x for s in students if process[s] == b for x in s.latencies]
                  for b in sorted(set(process.values()))}
    lat = [x for s in students for x in s.latencies]
    served = sum(s.served for s in students)
    return {
        "sessions": n, "processes": len(servers.procs), "period_s": period,
        "first_visit_requests": 1 + len(paths),
        "first_page_p50_s": pct(first, 0.5), "first_page_p90_s": pct(first, 0.9),
        "first_page_max_s": max(first, default=float("nan")),
        "server_cpu_s_per_first_page": join_cpu / n,
        "client_cpu_s_per_first_page": join_client_cpu / n, "join_wall_s": join_wall,
        "click_p50_s": pct(lat, 0.5), "click_p90_s": pct(lat, 0.9),
        "click_max_s": max(lat, default=float("nan")),
        "clicks_per_s": served / wall, "clicks_asked_per_s": n / period,
        "server_cpu_s_per_click": cpu / served if served else float("nan"),
        "server_cores_busy": cpu / wall,
        "client_cpu_s_per_click": client_cpu / served if served else float("nan"),
        "machine_busy_%": 100 * busy / (wall * os.cpu_count()),
        "client_loop_lag_p90_s": pct(lag.late, 0.9), "client_loop_lag_p99_s": pct(lag.late, 0.99),
        "clicks": sum(s.clicks for s in students), "served": served,
        "resets": sum(s.resets for s in students),
        "lost": sum(s.lost for s in students), "errors": sum(len(s.errors) for s in students),
        "cross_talk": sum(len(s.cross_talk) for s in students),
        "rss_before_mib": rss_before, "rss_peak_mib": rss_peak,
        "mib_per_session": (rss_peak - rss_before) / n,
        "rss_after_mib": rss_after,
        "rss_after_vs_before_%": 100 * (rss_after - rss_before) / rss_before,
        "first_errors": [e for s in students for e in s.errors + s.cross_talk][:5],
        "rss_trace": rss_trace,
        "click_p90_by_10s": by_window,
        "sessions_by_process": {b: sum(process[s] == b for s in students) for b in by_process},
        "click_p90_by_process": {b: pct(v, 0.9) for b, v in by_process.items()},
    }


def over_time(students: list[Student], t0: float, duration: float, window: float = 10.0):
    """Click p90 in each ``window`` seconds of the clicking phase (by when a click was due):
    a steady queue and a passing burst give the same p90 over 3 minutes, not over time."""
    bins: list[list[float]] = [[] for _ in range(max(1, int(duration // window) + 1))]
    for s in students:
        for due, lat in zip(s.dues, s.latencies):
            bins[min(len(bins) - 1, int((due - t0) // window))].append(lat)
    return [round(pct(b, 0.9), 3) for b in bins if b]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 10, 30, 60, 100])
    ap.add_argument("--period", type=float, default=2.0, help="seconds between a session's clicks")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of clicking")
    ap.add_argument("--join", type=float, default=2.0, help="the sessions start within this")
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds after the sessions leave before RSS is read again")
    ap.add_argument("--processes", type=int, default=1,
                    help="2 or more: Streamlit processes behind HAProxy (deploy/haproxy.cfg, "
                         "with server lines added beyond its two)")
    ap.add_argument("--assets", choices=("browser", "none"), default="browser",
                    help="browser: each first page also makes the requests a fresh Chromium "
                         "made (nothing cached); none: the websocket only")
    ap.add_argument("--server-env", nargs="*", default=[], metavar="NAME=VALUE",
                    help="extra environment for the Streamlit processes")
    ap.add_argument("--out", default="class_load", help="deploy/results/<out>.json/.csv")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    import pandas as pd
    from app.scenarios import SCENARIOS
    labels = [s.label for s in SCENARIOS.values()]
    log = print if args.verbose else (lambda *a: None)
    rows = []
    for n in args.sessions:
        # as deploy/run_class.sh runs them (MALLOC_ARENA_MAX=2: app/process_memory.py limit_heap_arenas)
        env = {"MALLOC_ARENA_MAX": "2", **dict(kv.split("=", 1) for kv in args.server_env)}
        with Servers(args.processes, env) as servers:
            row = asyncio.run(run_level(servers, n, args.period, args.duration, args.join,
                                        labels, args.settle, args.assets == "browser", log))
        rows.append(row)
        shown = {k: v for k, v in row.items() if not isinstance(v, (list, dict))}
        print(pd.DataFrame([shown]).to_string(index=False, float_format=lambda v: f"{v:.3f}"),
              flush=True)
        for e in row["first_errors"]:
            print("  ", e)
        print("   click p90 per 10 s:", row["click_p90_by_10s"])
        if len(row["sessions_by_process"]) > 1:
            print("   sessions per process:", row["sessions_by_process"],
                  " click p90 per process:", {b: round(v, 3) for b, v in
                                              row["click_p90_by_process"].items()})
    table = pd.DataFrame([{k: v for k, v in r.items() if not isinstance(v, (list, dict))}
                          for r in rows])
    print("\n" + table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    write_results(args.out, {"rows": rows, "args": vars(args)}, table)


if __name__ == "__main__":
    main()
