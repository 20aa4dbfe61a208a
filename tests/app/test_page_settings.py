"""The table of page settings (app/page_settings.py) is the one place a setting is declared."""
from __future__ import annotations

import dataclasses

from paged_kernels.dispatch import BACKENDS

from app.engine_build import make_config, make_params
from app.messages import PAGE_LABELS, page_words
from app.page_settings import BY_NAME, SETTINGS, Settings
from app.scenarios import preset


def test_every_setting_is_one_row_and_a_settings_field():
    fields = [f.name for f in dataclasses.fields(Settings)]
    assert fields == ["scenario", "semantics", *(r.name for r in SETTINGS), "real_vllm"]
    assert Settings().replace(n=2).n == 2 and Settings() == Settings()


def test_the_backend_choices_are_the_kernels_own():
    assert BY_NAME["backend"].options == ("auto", *BACKENDS)
    assert "triton-legacy" not in BY_NAME["backend"].help


def test_messages_name_settings_as_the_sidebar_does():
    assert PAGE_LABELS["max_num_batched_tokens"] == "token budget per step (v1)"
    assert page_words("num_gpu_blocks and semantics='v1'") == \
        "GPU pool (blocks) and the Engine “vLLM v1”"


def test_widget_numbers_are_read_back_as_the_setting_holds_them():
    assert BY_NAME["block_size"].read(8.0) == 8 and BY_NAME["temperature"].read(0.5) == 0.5
    assert BY_NAME["max_model_len"].read(0) is None and BY_NAME["max_model_len"].read(0.0) is None


def test_rows_map_onto_the_engine():
    s = preset("beam").replace(top_p=0.5, top_k=3)          # beams: sampling settings unused
    p = make_params(s)
    assert (p.beam_width, p.top_p, p.top_k) == (3, 1.0, -1)
    v0, v1 = make_config(s), make_config(s.replace(semantics="v1", beam_width=1))
    assert v1.max_num_batched_tokens == s.max_num_batched_tokens
    assert v0.max_num_batched_tokens != s.max_num_batched_tokens   # v0 keeps its default
