"""Warm each Streamlit process before a class arrives: one session opens the page and steps
every preset to its end, speaking Streamlit's own websocket protocol
(deploy/checks/protocol_session.py), so what a process does once (importing torch and Plotly,
loading the model, the first figures of each kind) is done before the first student comes.

Measured (docs/hosting.md, "A class of 100"): 100 students joining within 2 s across three
processes, two of them cold, waited 8.5 s (p90) for their first page, and the servers spent
0.119 s of CPU per first page (so ~4 s for each cold process's first); with all three warm,
1.5 s and 0.034 s.
deploy/run_class.sh runs this on every process before it starts HAProxy.

Usage: python deploy/warm_up.py http://127.0.0.1:8601 [http://127.0.0.1:8602 ...]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):          # python deploy/warm_up.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy.checks.protocol_session import ProtocolSession  # noqa: E402

MAX_STEPS = 400                        # per preset; every preset ends well before this


async def warm_up(url: str, cookie: str = "") -> int:
    """One session at ``url`` steps every preset to its end (the preset's run disables Step);
    the number of Step clicks. A run that raised on the page raises here."""
    from app.scenarios import SCENARIOS
    clicks = 0
    async with ProtocolSession(url, cookie=cookie) as s:
        _check(await s.first_page(), url)
        for scenario in SCENARIOS.values():
            _check(await s.choose("w_scenario", scenario.label), url)
            for _ in range(MAX_STEPS):
                if s.disabled.get("step_btn"):
                    break
                _check(await s.click("step_btn"), url)
                clicks += 1
    return clicks


def _check(run, url: str) -> None:
    if run.exceptions:
        raise RuntimeError(f"{url}: the page raised while warming up: {run.exceptions[0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("urls", nargs="+", help="each Streamlit process's own address (not the proxy)")
    args = ap.parse_args()
    for url in args.urls:
        t0 = time.perf_counter()
        clicks = asyncio.run(warm_up(url.rstrip("/")))
        print(f"warmed {url}: every preset stepped to its end ({clicks} Steps) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
