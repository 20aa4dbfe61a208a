"""Import and load failures said plainly (app/failures.py): the package and version a failure
came from, the tested version where it differs, the command that fixes it, and no server path.

The failures are real ones, raised by the installed libraries: a stray package folder earlier
on sys.path than site-packages (how the repository's old ``kernels/`` broke transformers 5.25),
a model folder transformers cannot read, a package that is not installed.
"""
from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from app import failures
from app.failures import describe_failure
from app.messages import unexpected_message
from engine.models import loader

from .conftest import ROOT, needs_model

TRANSFORMERS = metadata.version("transformers")
SAFETENSORS = metadata.version("safetensors")


def stray_safetensors(tmp_path):
    """A folder holding an empty ``safetensors`` package: put first on the path, it hides the
    installed one, and transformers' import of ``safe_open`` fails as it did on ``kernels``."""
    (tmp_path / "safetensors").mkdir()
    (tmp_path / "safetensors" / "__init__.py").write_text("")
    return tmp_path


def run_python(code: str, pythonpath, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath)), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_stray_package_hiding_an_installed_one_is_named(tmp_path):
    stray = stray_safetensors(tmp_path)
    out = run_python("""
        from app.failures import describe_failure
        try:
            import transformers.models.llama.modeling_llama
        except ImportError as exc:
            print(describe_failure(exc))
        else:
            print("IMPORTED")
    """, [stray, ROOT])
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout.strip()
    assert text != "IMPORTED"
    assert f"inside transformers {TRANSFORMERS}" in text, text
    assert f"stray copy, not the installed safetensors {SAFETENSORS}" in text, text
    assert "cannot import name 'safe_open'" in text, text
    assert str(tmp_path) not in text and "/" not in text.replace("…/", ""), text


def test_a_model_folder_transformers_cannot_read(tmp_path):
    try:
        loader.read_spec(tmp_path)
    except (OSError, ValueError) as exc:
        text = describe_failure(exc)
    else:
        pytest.fail("transformers read a config from an empty folder")
    assert text is not None
    assert f"inside transformers {TRANSFORMERS}" in text, text
    assert str(tmp_path) not in text, text


def test_a_version_other_than_the_tested_one_is_said_with_the_fix(tmp_path, monkeypatch):
    lock = tmp_path / "requirements.txt"
    lock.write_text("transformers==0.0.1 \\\n    --hash=sha256:00\n")
    monkeypatch.setattr("app.failures.LOCK", lock)
    assert failures.tested_versions() == {"transformers": "0.0.1"}
    try:
        loader.read_spec(tmp_path)
    except (OSError, ValueError) as exc:
        text = describe_failure(exc)
    assert f"transformers {TRANSFORMERS} (tested: 0.0.1)" in text, text
    assert "bash deploy/install.sh" in text, text


def test_a_missing_package_is_named_with_the_fix():
    try:
        import paged_lab_no_such_package  # noqa: F401
    except ImportError as exc:
        text = describe_failure(exc)
    assert "the package paged_lab_no_such_package is not installed" in text, text
    assert "bash deploy/install.sh" in text, text


def test_our_own_errors_stay_a_short_line():
    try:
        int("not a number")
    except ValueError as exc:
        assert describe_failure(exc) is None
        assert unexpected_message(exc).startswith("Something went wrong on the server "
                                                  "(ValueError)")


def test_the_lock_records_the_versions_the_page_runs_on():
    tested = failures.tested_versions()
    for name in ("transformers", "streamlit", "plotly", "safetensors"):
        assert name in tested, f"{name} is not pinned in deploy/locks/requirements.txt"


@needs_model
def test_the_page_names_the_package_when_the_model_cannot_load(tmp_path):
    """The page itself (AppTest, in a process whose path has the stray folder before
    site-packages): the error names transformers and safetensors, the page draws no
    exception, and the server path stays in the log."""
    stray = stray_safetensors(tmp_path)
    out = run_python(f"""
        import json
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file({str(ROOT / "app" / "streamlit_app.py")!r}, default_timeout=240)
        at.run()
        print(json.dumps({{"exceptions": [e.value for e in at.exception],
                           "errors": [e.value for e in at.error]}}))
    """, [stray])
    assert out.returncode == 0, out.stderr[-3000:]
    shown = json.loads(out.stdout.strip().splitlines()[-1])
    assert shown["exceptions"] == [], shown
    text = " ".join(shown["errors"])
    assert f"Loading the model failed inside transformers {TRANSFORMERS}" in text, shown
    assert "safetensors" in text and "stray copy" in text, shown
    assert str(tmp_path) not in text, shown
    assert str(tmp_path) in out.stderr            # the traceback, in the server's log
