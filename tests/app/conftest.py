"""Fixtures for the page's tests.

The model is PAGED_LAB_MODEL if set (e.g. a local folder), else the embedded "default" one.
Figure and narration unit tests mostly use ``Engine.length_only`` (the real block manager and
scheduler with random logits): no weights needed, so they are fast.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
MODEL = os.environ.get("PAGED_LAB_MODEL", "").strip() or "default"


def model_available() -> bool:
    if MODEL == "default":
        return (ROOT / "assets" / "default-model" / "config.json").is_file()
    return Path(MODEL).is_dir()


needs_model = pytest.mark.skipif(not model_available(),
                                 reason=f"model {MODEL!r} is not available (set PAGED_LAB_MODEL "
                                        "or add assets/default-model)")


@pytest.fixture(scope="session")
def model() -> str:
    if not model_available():
        pytest.skip(f"model {MODEL!r} is not available")
    return MODEL


def run_length_only(prompts, params, steps, **config):
    """A length-only engine stepped ``steps`` times; returns (engine, results)."""
    cfg = dict(block_size=4, num_gpu_blocks=32, seed=0)
    cfg.update(config)
    eng = Engine.length_only(EngineConfig(**cfg), max_model_len=256, vocab_size=64,
                             detailed_snapshots=True)
    for p in prompts:
        eng.add_request(p, params)
    results = []
    for _ in range(steps):
        if not eng.has_unfinished_requests():
            break
        results.append(eng.step())
    return eng, results


@pytest.fixture(scope="session")
def parallel_run():
    """n=4 on a 10-token prompt (2 full blocks + 2 tokens of a shared partial block)."""
    return run_length_only([list(range(1, 11))],
                           SamplingParams(n=4, temperature=1.0, max_tokens=6, ignore_eos=True),
                           3)


@pytest.fixture(scope="session")
def beam_run():
    return run_length_only([list(range(1, 8))],
                           SamplingParams(beam_width=3, max_tokens=8, ignore_eos=True), 8,
                           num_gpu_blocks=48)


@pytest.fixture(scope="session")
def swap_run():
    prompts = [list(range(1 + i, 8 + i)) for i in range(4)]
    return run_length_only(prompts, SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True),
                           30, num_gpu_blocks=14, num_cpu_blocks=16, preemption_mode="swap")


@pytest.fixture(scope="session")
def prefix_run():
    common = list(range(1, 10))
    prompts = [common + [20 + i, 30 + i] for i in range(3)]
    return run_length_only(prompts, SamplingParams(max_tokens=4, ignore_eos=True), 2,
                           enable_prefix_caching=True)


@pytest.fixture(autouse=True, scope="package")
def _restore_torch_threads():
    """The page sets torch's process-wide thread count for a server (PAGED_LAB_TORCH_THREADS);
    AppTest runs the page in this process, so the other tests get the count back."""
    import torch
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def browser_missing() -> str | None:
    """Why the real-browser tests cannot run here (None: they can): the playwright package,
    and Debian's Chromium (app/screenshots.py CHROMIUM)."""
    import shutil
    from app.screenshots import CHROMIUM
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def browser_marks() -> list:
    """A browser test module's ``pytestmark``: marked ``browser``, needs the default model,
    skipped (saying why, also printed in the run's output) where Chromium or playwright is
    missing."""
    missing = browser_missing()
    if missing:
        print(f"\nbrowser tests skipped: {missing}")
    return [pytest.mark.browser, needs_model,
            pytest.mark.skipif(missing is not None, reason=f"browser tests: {missing}")]
