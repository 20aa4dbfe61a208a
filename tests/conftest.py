"""Shared fixtures: tiny random-weight checkpoints built from configs (no downloads); and the
``soak`` marker's rule: soak tests are deselected unless the ``-m`` expression names ``soak``
(``python -m pytest -m soak tests/soak``), so a plain ``python -m pytest`` (CI) leaves them out."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    if "soak" in (config.getoption("markexpr") or ""):
        return                                   # -m names soak: its expression decides
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]


def build_tiny(path, arch: str, **overrides):
    """Save a tiny random HF model of ``arch`` under ``path``; returns the HF model."""
    import transformers

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None,
                  initializer_range=0.1)   # peaky logits: argmax ties would make parity flaky
    common.update(overrides)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**common)).eval()
    model.save_pretrained(str(path))
    return model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return str(path), build_tiny(path, "llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    return str(path), build_tiny(path, "qwen2")


@pytest.fixture(scope="session")
def micro_llama(tmp_path_factory):
    """An even smaller model (with an EOS token) for property tests that step many engines."""
    path = tmp_path_factory.mktemp("micro-llama")
    build_tiny(path, "llama", vocab_size=64, hidden_size=16, intermediate_size=32,
               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
               max_position_embeddings=128, eos_token_id=3)
    return str(path)


@pytest.fixture(scope="session")
def default_model_path():
    """The embedded default model's folder (assets/default-model)."""
    from engine.models.loader import resolve_model_path
    return str(resolve_model_path("default"))
