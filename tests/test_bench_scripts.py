"""Every script in bench/ (benchmarks) and deploy/checks/ (hosting checks, outside CI) runs as
``python <folder>/X.py`` and as ``python -m <package>.X``, with or without the repository on
PYTHONPATH (a file in bench/ named like a top-level package, e.g. the old bench/engine.py,
shadowed the ``engine`` package). ``--help`` only: nothing is measured. The two folders stay
apart: bench/ imports nothing from deploy/, deploy/checks/ nothing from bench/."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("bench", "deploy/checks")
HELPERS = {"__init__", "common", "browser", "protocol_session"}   # imported by the scripts, not run
FILES = {folder: sorted(p for p in (ROOT / folder).glob("*.py") if p.stem != "__init__")
         for folder in FOLDERS}
SCRIPTS = [(folder, p.stem) for folder in FOLDERS for p in FILES[folder]
           if p.stem not in HELPERS]


def test_no_script_shadows_a_package():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert not packages & {p.stem for folder in FOLDERS for p in FILES[folder]}


@pytest.mark.slow                 # ~70 s on 2 cores: three interpreters per script
def test_every_script_starts_both_ways():
    env_plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_path = {**env_plain, "PYTHONPATH": str(ROOT)}
    runs = {}
    for folder, name in SCRIPTS:
        file, module = f"{folder}/{name}.py", f"{folder.replace('/', '.')}.{name}"
        for how, cmd, env in [("file", [sys.executable, file, "--help"], env_plain),
                              ("file+path", [sys.executable, file, "--help"], env_path),
                              ("module", [sys.executable, "-m", module, "--help"], env_plain)]:
            runs[(file, how)] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True)
    failed = {}
    for key, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage" not in out.lower():
            failed[key] = err[-500:]
    assert not failed, failed


def imported_packages(path: Path) -> set[str]:
    """The top-level names ``path`` imports (absolute imports only)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("folder, other", [("bench", "deploy"), ("deploy/checks", "bench")])
def test_benchmarks_and_hosting_checks_import_nothing_of_each_other(folder, other):
    assert FILES[folder]
    wrong = [p.name for p in FILES[folder] if other in imported_packages(p)]
    assert not wrong, f"{folder}/ {wrong} import {other}"
