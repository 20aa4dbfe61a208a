"""The protocol-level client checked against a real browser: the same clicks on the same
preset, once in Chromium (Playwright, deploy/checks/browser.py) and once over the websocket
(deploy/checks/protocol_session.py), must show the same step counter and the same figures'
data (every trace of the figures the Memory tab draws, as Plotly holds them in the page:
``gd.data`` of each chart, against the ``spec`` the client received).

Usage: python deploy/checks/protocol_validation.py [--preset mixed] [--clicks 12]
(tests/app/test_protocol_client.py runs it in the browser tests.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.protocol_session import ProtocolSession, _figure_title  # noqa: E402

# each drawn chart's title and data, as Plotly holds them in the page (gd.layout, gd.data)
FIGURES_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
  const t = gd.layout && gd.layout.title;
  return {title: typeof t === 'string' ? t : (t && t.text) || '', data: gd.data};
})"""


def comparable(data) -> str:
    """A trace list as canonical JSON: without the ids Plotly gives traces in the page, and
    with whole floats written as integers (JavaScript has one number type: 2.0 comes back 2)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "uid"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, float) and x.is_integer():
            return int(x)
        return x
    return json.dumps(strip(data), sort_keys=True)


async def in_chromium(url: str, label: str, clicks: int) -> dict:
    from playwright.async_api import async_playwright

    from deploy.checks.browser import (choose_preset, click_step, fresh_page, launch,
                                       shown_step, wait_shown)
    async with async_playwright() as p:
        browser = await launch(p)
        ctx, page = await fresh_page(browser)
        await page.goto(url)
        await wait_shown(page, 0)
        await choose_preset(page, label)
        for i in range(clicks):
            await click_step(page, i + 1)
        step = await shown_step(page)
        figures = {f["title"]: comparable(f["data"])
                   for f in await page.evaluate(FIGURES_JS)}
        await browser.close()
    return {"step": step, "figures": figures}


async def over_protocol(url: str, label: str, clicks: int) -> dict:
    async with ProtocolSession(url) as s:
        await s.first_page()
        run = await s.choose("w_scenario", label)
        for _ in range(clicks):
            run = await s.click("step_btn")
    return {"step": run.step,
            "figures": {_figure_title(spec): comparable(spec.get("data", []))
                        for spec in run.figures.values()}}


def differences(browser: dict, protocol: dict) -> list[str]:
    """What differs between the two sessions' views, in words (empty: the same)."""
    out = []
    if browser["step"] != protocol["step"]:
        out.append(f"step counter: Chromium {browser['step']}, client {protocol['step']}")
    if set(browser["figures"]) != set(protocol["figures"]):
        out.append(f"figures: Chromium {sorted(browser['figures'])}, "
                   f"client {sorted(protocol['figures'])}")
    for title in set(browser["figures"]) & set(protocol["figures"]):
        if browser["figures"][title] != protocol["figures"][title]:
            out.append(f"figure {title!r}: data differ")
    return out


def validate(url: str, label: str, clicks: int) -> tuple[dict, dict, list[str]]:
    """Both sessions against the server at ``url`` (each a fresh session of its own)."""
    browser = asyncio.run(in_chromium(url, label, clicks))
    protocol = asyncio.run(over_protocol(url, label, clicks))
    return browser, protocol, differences(browser, protocol)


def main() -> int:
    from app.scenarios import SCENARIOS
    from app.screenshots import free_port, start_server, stop_server, wait_healthy
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mixed", choices=list(SCENARIOS))
    ap.add_argument("--clicks", type=int, default=12)
    args = ap.parse_args()
    port = free_port()
    proc = start_server(port)
    try:
        wait_healthy(port, proc)
        browser, protocol, diff = validate(f"http://127.0.0.1:{port}",
                                           SCENARIOS[args.preset].label, args.clicks)
    finally:
        stop_server(proc)
    print(f"{args.preset}, {args.clicks} Step clicks: Chromium shows step {browser['step']}, "
          f"the protocol client step {protocol['step']}; figures compared: "
          f"{sorted(browser['figures'])}")
    for d in diff:
        print("DIFFERS:", d)
    print("OK: the same step and the same figures' data" if not diff else "FAILED")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
