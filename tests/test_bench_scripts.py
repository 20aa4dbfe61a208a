"""Every benchmark runs as ``python bench/X.py`` and as ``python -m bench.X``, with or without
the repository on PYTHONPATH (a file in bench/ named like a top-level package, e.g. the old
bench/engine.py, shadowed the ``engine`` package). ``--help`` only: nothing is measured."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "common")


def test_no_bench_file_shadows_a_package():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert not packages & set(SCRIPTS)


def test_every_bench_script_starts_both_ways():
    env_plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_path = {**env_plain, "PYTHONPATH": str(ROOT)}
    runs = {}
    for name in SCRIPTS:
        for how, cmd, env in [("file", [sys.executable, f"bench/{name}.py", "--help"], env_plain),
                              ("file+path", [sys.executable, f"bench/{name}.py", "--help"], env_path),
                              ("module", [sys.executable, "-m", f"bench.{name}", "--help"], env_plain)]:
            runs[(name, how)] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)
    failed = {}
    for key, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage" not in out.lower():
            failed[key] = err[-500:]
    assert not failed, failed
