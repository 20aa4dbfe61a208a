"""The Engine choice "Real vLLM" without running vLLM: what the page says when vLLM is not
installed (the one command that adds it) or the server has not turned the choice on, and the
scenarios' real-vLLM presets (blocks vLLM's CPU attention takes). Running it: tests/vllm_real."""
from __future__ import annotations

import pytest

import real_vllm.environment as environment
from app import hosting
from app.scenarios import (ENGINE_CHOICES, REAL_VLLM, REAL_VLLM_BLOCK_MULTIPLE, SCENARIOS,
                           engine_choice, preset, under_engine)
from app.engine_build import build_engine
from app.lab import Lab
from app.real_vllm_slots import real_vllm_status

from .conftest import MODEL


def test_not_installed_names_the_command_that_adds_it(monkeypatch):
    monkeypatch.setattr(environment, "installed_version", lambda: None)
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "1")
    s = under_engine(preset("single", MODEL), REAL_VLLM)
    with pytest.raises(ValueError, match="not installed; to add it: bash deploy/install_vllm.sh"):
        build_engine(s)
    usable, line = real_vllm_status()
    assert not usable and "deploy/install_vllm.sh" in line


def test_off_unless_the_server_turns_it_on(monkeypatch):
    monkeypatch.setattr(environment, "installed_version", lambda: "0.32.0")
    monkeypatch.delenv("PAGED_LAB_REAL_VLLM", raising=False)
    s = under_engine(preset("single", MODEL), REAL_VLLM)
    with pytest.raises(ValueError, match="PAGED_LAB_REAL_VLLM=1 streamlit run app"):
        build_engine(s)
    usable, line = real_vllm_status()
    assert not usable and "PAGED_LAB_REAL_VLLM" in line
    lab = Lab.create("single", MODEL)
    before = lab.engine
    assert not lab.apply(s)                       # refused: the session keeps its engine
    assert lab.engine is before and "PAGED_LAB_REAL_VLLM" in lab.error
    monkeypatch.setenv("PAGED_LAB_REAL_VLLM", "two")
    with pytest.raises(ValueError, match="PAGED_LAB_REAL_VLLM must be an integer"):
        hosting.real_vllm_sessions()


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_each_scenario_has_a_preset_real_vllm_can_run(key):
    assert ENGINE_CHOICES[-1] == REAL_VLLM
    s = under_engine(preset(key, MODEL), REAL_VLLM)
    assert engine_choice(s) == REAL_VLLM and s.semantics == "v1" and s.real_vllm
    if SCENARIOS[key].real_vllm is None:          # beam search: not a vLLM v1 request
        assert s.beam_width > 1
        return
    assert s.block_size % REAL_VLLM_BLOCK_MULTIPLE == 0
    assert (s.num_gpu_blocks - 1) * s.block_size >= s.max_model_len
    if s.temperature > 0:                         # seeded: no prompt may be chunked on a CPU
        assert s.max_num_batched_tokens >= s.n * len(s.prompts.splitlines()) * s.max_model_len
    back = under_engine(s, "v1")
    assert not back.real_vllm and engine_choice(back) == "v1"
