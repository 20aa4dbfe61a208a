"""Find a checkpoint (embedded default, local folder or hub id) and load it into our model code.

Loaded models are cached per process and shared read-only: many engines (e.g. one per browser
session) reuse one copy of the weights; each engine owns only its KV cache.
"""
from __future__ import annotations

import functools
import os
import threading
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.gpt2 import GPT2LMHeadModel
from engine.models.llama import LlamaForCausalLM
from engine.models.spec import ModelSpec

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "default-model"
_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]


@dataclass(frozen=True)
class LoadedModel:
    path: str
    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: object | None     # a transformers tokenizer, or None (token-id prompts only)


def resolve_model_path(model: str) -> Path:
    """'default' -> assets/default-model; an existing folder -> itself; else a hub download."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError("model must be 'default', a local folder or a Hugging Face hub id")
    if model == "default":
        if not (DEFAULT_MODEL_DIR / "config.json").is_file():
            raise ValueError(f"the embedded default model is missing from {DEFAULT_MODEL_DIR}; "
                             "retrain it with train/train_default_model.py")
        return DEFAULT_MODEL_DIR
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{model!r} is a folder but holds no config.json (not a HF checkpoint)")
        return path
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or os.sep == "\\" and "\\" in model
    if looks_local:
        raise ValueError(f"unknown model {model!r}: no such folder")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, allow_patterns=_WEIGHT_PATTERNS))
    except Exception as exc:  # offline, unknown repo, gated...
        raise ValueError(f"could not load model {model!r}: it is not a local folder and fetching it "
                         f"from the Hugging Face hub failed ({type(exc).__name__}). Offline? "
                         "Use 'default' or a local folder.") from exc


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    raise ValueError(f"no weights (*.safetensors or pytorch_model*.bin) in {path}")


_GPT2_BUFFERS = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")   # causal-mask buffers, not weights


def gpt2_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF GPT-2 names as our module expects them: ``transformer.``-prefixed (the original
    OpenAI-converted checkpoints omit the prefix), without the attention-mask buffers."""
    out = {}
    for k, v in state.items():
        if _GPT2_BUFFERS.search(k):
            continue
        if not k.startswith(("transformer.", "lm_head.")):
            k = "transformer." + k
        out[k] = v
    return out


_LOAD_LOCK = threading.Lock()


def _with_generation_eos(spec: ModelSpec, path: Path) -> ModelSpec:
    """generation_config.json's eos_token_id, when the file sets one, replaces config.json's
    (transformers' generate reads the generation config; both may list several ids)."""
    if not (path / "generation_config.json").exists():
        return spec
    from transformers import GenerationConfig
    try:
        gen = GenerationConfig.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}/generation_config.json could not be read: {exc}") from exc
    return spec.with_eos(gen.eos_token_id) if gen.eos_token_id is not None else spec


def load_model(model: str, device: str, dtype: torch.dtype) -> LoadedModel:
    """Load once per process (thread-safe: many browser sessions may start at once)."""
    with _LOAD_LOCK:
        return _load_model(model, device, dtype)


@functools.lru_cache(maxsize=4)
def _load_model(model: str, device: str, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model_path(model)
    spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(str(path)))
    spec = _with_generation_eos(spec, path)
    if spec.model_type == "gpt2":
        net = GPT2LMHeadModel(spec)
        state = gpt2_state_dict(_read_state_dict(path))
    else:
        net = LlamaForCausalLM(spec)
        state = {k: v for k, v in _read_state_dict(path).items() if "rotary_emb" not in k}
    if spec.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (spec.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the {spec.model_type} architecture: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    net = net.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if hasattr(net, "fuse_projections"):
        net.fuse_projections()
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    return LoadedModel(str(path), spec, net, tokenizer)
