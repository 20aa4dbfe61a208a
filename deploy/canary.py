"""The newest-versions canary (issue 37): in an environment made by
``bash deploy/install.sh --dev --latest``, a smoke set of what a new user does first, and, when
it fails, which package and version did it.

    python deploy/canary.py [--lock deploy/locks/requirements-dev.txt] [--max-reverts 12]

The smoke set: import the project and transformers' Llama and GPT-2 code with the root first on
sys.path (tests/install), the README's Python example, ``AppTest`` of every preset
(tests/app/test_page.py), and one Step in Chromium on ``streamlit run app``. First it prints how
the environment differs from the locked, tested set. When a check fails, it puts the locked
versions back one package at a time (the one the failure's traceback names first, then the
rest), rerunning that check after each, until it passes: the last package put back is the one
that broke it, said as "CANARY: <package> <newest> breaks ... (<locked> passes)". The reverts
change this environment, which is CI's throwaway canary. Exit 0 only when every check passed.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.tested_set import DEV_LOCK, normalize, pinned  # noqa: E402

PY = sys.executable
IMPORT_CODE = ("import engine, paged_kernels, analysis, app.lab; "
               "import transformers.models.llama.modeling_llama, "
               "transformers.models.gpt2.modeling_gpt2; print('imported')")
# torch is installed first by deploy/install.sh, at its own pin, and is not in the locks
NOT_LOCKED = {"torch", "pip", "setuptools", "wheel", "uv"}
SITE_FRAME = re.compile(r'File "[^"]*[/\\](?:site|dist)-packages[/\\]([A-Za-z0-9_]+)')


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    output: str


# ---- the environment against the lock -------------------------------------------------------
def installed() -> dict[str, tuple[str, str]]:
    """normalized name -> (distribution name, version) of everything installed here."""
    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out[normalize(name)] = (name, dist.version)
    return out


def drift(have: dict[str, tuple[str, str]], locked: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """(name, locked version or None, installed version or None) for each package whose
    installed version is not the locked one, sorted by name; torch and the installers aside."""
    rows = []
    for key in sorted(set(have) | set(locked)):
        if key in NOT_LOCKED:
            continue
        now = have.get(key, (key, None))[1]
        if now != locked.get(key):
            rows.append((have.get(key, (key, None))[0], locked.get(key), now))
    return rows


def suspects_first(rows, output: str) -> list[tuple[str, str | None, str | None]]:
    """The drifted packages, those whose files the failure's traceback passes through first
    (innermost first), then the rest in name order."""
    tops = list(dict.fromkeys(reversed(SITE_FRAME.findall(output))))
    try:
        dists = metadata.packages_distributions()
    except Exception:                     # some package's broken metadata: order by name only
        dists = {}
    named = [normalize(d) for top in tops for d in dists.get(top, [top])]
    rank = {key: i for i, key in enumerate(dict.fromkeys(named))}
    return sorted(rows, key=lambda r: (rank.get(normalize(r[0]), len(rank)), normalize(r[0])))


def put_back(name: str, version: str | None) -> bool:
    """The locked version of ``name`` (or, not in the lock, none at all); True if pip did it."""
    cmd = ([PY, "-m", "pip", "install", "-q", "--no-deps", f"{name}=={version}"] if version
           else [PY, "-m", "pip", "uninstall", "-y", "-q", name])
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        print(f"    could not put back {name} {version or '(uninstall)'}: {run.stderr.strip()[-300:]}")
    return run.returncode == 0


# ---- the smoke set --------------------------------------------------------------------------
def run(name: str, cmd: list[str], timeout: float = 900, env: dict | None = None) -> Result:
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=env)
        ok, out = proc.returncode == 0, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        ok, out = False, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return Result(name, ok, time.perf_counter() - t, out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser_step(timeout: float = 300) -> Result:
    """`streamlit run app` from this environment, then deploy/checks/first_run.py: the first
    figure, one Step, no error on the page."""
    port = free_port()
    env = dict(os.environ, STREAMLIT_SERVER_HEADLESS="true", STREAMLIT_SERVER_PORT=str(port),
               STREAMLIT_SERVER_ADDRESS="127.0.0.1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = ROOT / ".canary-streamlit.log"
    t = time.perf_counter()
    with open(log, "w") as fh:
        server = subprocess.Popen([PY, "-m", "streamlit", "run", "app"], cwd=ROOT, env=env,
                                  stdout=fh, stderr=subprocess.STDOUT)
    try:
        health = f"http://127.0.0.1:{port}/_stcore/health"
        while True:                        # until the server answers, it exits, or time is up
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.perf_counter() - t > timeout:
                return Result("browser", False, time.perf_counter() - t,
                              "streamlit run app did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.2)
        res = run("browser", [PY, "deploy/checks/first_run.py", "--url", f"http://127.0.0.1:{port}",
                              "--steps", "1", "--timeout", "240"], timeout)
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
    if not res.ok:
        res.output += "\n-- the server's log --\n" + log.read_text()[-4000:]
    log.unlink(missing_ok=True)
    return res


CHECKS = {
    "import": lambda: run("import", [PY, "-c", IMPORT_CODE]),
    "readme": lambda: run("readme", [PY, "deploy/checks/readme_example.py"]),
    "presets": lambda: run("presets", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                       "tests/install",
                                       "tests/app/test_page.py::test_scenario_page_matches_engine"]),
    "browser": browser_step,
}
WHAT = {"import": "the project's and transformers' imports (root first on sys.path)",
        "readme": "the README's Python example", "presets": "AppTest of every preset",
        "browser": "one Step in Chromium"}


def tail(text: str, lines: int = 25) -> str:
    return "\n".join("    " + ln for ln in text.strip().splitlines()[-lines:])


def find_culprit(name: str, failed: Result, rows, max_reverts: int) -> str:
    """Put locked versions back one at a time until ``name`` passes; what that says."""
    tried = []
    for pkg, locked_v, now_v in suspects_first(rows, failed.output)[:max_reverts]:
        print(f"  putting back {pkg} {locked_v or '(not in the lock: uninstalled)'} "
              f"(installed {now_v or '-'}), rerunning {name}")
        if not put_back(pkg, locked_v):
            continue
        tried.append(pkg)
        again = CHECKS[name]()
        if again.ok:
            earlier = f", with {', '.join(tried[:-1])} put back before it" if tried[:-1] else ""
            return (f"CANARY: {pkg} {now_v or '(absent)'} breaks {WHAT[name]} "
                    f"({pkg} {locked_v or 'not installed'} passes{earlier})")
    return (f"CANARY: {WHAT[name]} still fails with {', '.join(tried) or 'nothing'} put back: "
            "the break is not one package's (see the output above)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lock", type=Path, default=DEV_LOCK, help="the tested set to compare with")
    ap.add_argument("--max-reverts", type=int, default=12,
                    help="at most this many packages put back per failed check")
    ap.add_argument("--only", choices=list(CHECKS), action="append",
                    help="run only these checks (repeatable)")
    args = ap.parse_args()
    locked = pinned(args.lock)
    if not locked:
        print(f"no lock at {args.lock.relative_to(ROOT) if args.lock.is_relative_to(ROOT) else args.lock}")
        return 2
    rows = drift(installed(), locked)
    print(f"== newest allowed versions against {args.lock.name}: {len(rows)} differ")
    for pkg, was, now in rows:
        print(f"  {pkg:32} locked {was or '-':14} installed {now or '-'}")
    failures = []
    for name in args.only or list(CHECKS):
        res = CHECKS[name]()
        last = (res.output.strip().splitlines() or [""])[-1]
        print(f"== {name}: {'passed' if res.ok else 'FAILED'} in {res.seconds:.1f} s ({WHAT[name]})"
              + (f": {last[:200]}" if res.ok else ""))
        if not res.ok:
            print(tail(res.output, 40))
            failures.append((name, res))
    if not failures:
        print("canary: every check passed on the newest allowed versions")
        return 0
    for name, res in failures:
        print(find_culprit(name, res, rows, args.max_reverts) if rows else
              f"CANARY: {WHAT[name]} fails on the locked versions too: not drift")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
