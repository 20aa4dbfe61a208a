"""A new user's first run, checked in Chromium: the page at URL (started by the user's own
command, e.g. ``.venv/bin/streamlit run app``) draws its first figure with no error on it,
then one Step draws step 1. CI runs it against the page's environment (issue 37); the
browser side needs playwright, so it runs from the tests' environment.

    python deploy/checks/first_run.py --url http://127.0.0.1:8501 [--steps 1]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.browser import click_step, exceptions_on, fresh_page, launch, wait_shown  # noqa: E402

# what the page shows instead of a figure when its engine could not be built or drawn
FAILURE_TEXTS = ("No engine yet", "Something went wrong", "could not be drawn", "failed inside")


async def errors_on(page) -> list[str]:
    """Exceptions and red error boxes on the page, and any failure text of the page's own."""
    found = await exceptions_on(page)
    for box in await page.locator('[data-testid="stAlertContentError"]').all():
        found.append(await box.inner_text())
    body = await page.locator("body").inner_text()
    found += [f"page text: {t!r}" for t in FAILURE_TEXTS if t in body]
    return found


async def check(url: str, steps: int, timeout_s: float) -> int:
    from playwright.async_api import async_playwright
    async with async_playwright() as p:
        browser = await launch(p)
        try:
            ctx, page = await fresh_page(browser, timeout_s * 1000)
            t0 = time.perf_counter()
            await page.goto(url)
            try:
                await wait_shown(page, 0, timeout_s * 1000)
            except Exception as exc:            # what the page showed instead, then fail
                print(f"FAILED: the first figure was not drawn within {timeout_s:.0f} s ({exc}); "
                      f"the page shows: {await errors_on(page) or (await page.locator('body').inner_text())[:800]}")
                return 1
            print(f"first figure (step 0, the pool) drawn {time.perf_counter() - t0:.1f} s after "
                  f"opening {url}")
            for n in range(1, steps + 1):
                print(f"Step -> step {n} drawn in {await click_step(page, n, timeout_s * 1000):.2f} s")
            errors = await errors_on(page)
            if errors:
                print("FAILED: errors on the page:\n  " + "\n  ".join(errors))
                return 1
            print("no error on the page")
            await ctx.close()
            return 0
        finally:
            await browser.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8501", help="the running page")
    ap.add_argument("--steps", type=int, default=1, help="Step clicks after the first figure")
    ap.add_argument("--timeout", type=float, default=180, help="seconds to wait for each figure")
    args = ap.parse_args()
    return asyncio.run(check(args.url, args.steps, args.timeout))


if __name__ == "__main__":
    raise SystemExit(main())
