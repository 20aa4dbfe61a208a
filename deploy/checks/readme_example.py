"""Runs the README's Python example ("Use the engine from Python": its first ``python`` code
block) exactly as written, from the repository root, and says what it printed. CI runs it in
the page's environment and in the newest-versions canary (issue 37).

    python deploy/checks/readme_example.py
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Use the engine from Python"


def example(readme: Path = ROOT / "README.md") -> str:
    text = readme.read_text()
    if SECTION not in text:
        raise SystemExit(f"README.md has no section {SECTION!r}")
    block = re.search(r"```python\n(.*?)```", text.split(SECTION, 1)[1], re.S)
    if block is None:
        raise SystemExit(f"README.md's {SECTION!r} has no python block")
    return block.group(1)


def main() -> int:
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    run = subprocess.run([sys.executable, "-c", example()], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    lines = run.stdout.splitlines()
    print(f"README example: exit {run.returncode}, {len(lines)} lines printed; last: "
          f"{lines[-1] if lines else '(none)'}")
    if run.returncode:
        print(run.stderr[-4000:])
    return run.returncode


if __name__ == "__main__":
    raise SystemExit(main())
