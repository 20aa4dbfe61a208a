"""Real vLLM in the test process: skipped, saying why, where it is not installed or does not
import (never a silent pass)."""
from __future__ import annotations

import pytest

from real_vllm.environment import VllmUnavailable, import_vllm


@pytest.fixture(scope="session")
def vllm_ready():
    try:
        import_vllm()
    except VllmUnavailable as e:
        pytest.skip(f"real vLLM unavailable: {e}")
