"""Find a checkpoint (embedded default, local folder or hub id) and load it into our model code.

Loaded models are cached per process and shared read-only: many engines (e.g. one per browser
session) reuse one copy of the weights; each engine owns only its KV cache. The cache keeps the
``PAGED_LAB_MAX_MODELS`` (default 2) most recently used models, so a server's memory stays
bounded. A checkpoint's size and architecture can be read from its headers and config.json
alone (``checkpoint_bytes``, ``read_spec``): a server can refuse a model before reading weights.
"""
from __future__ import annotations

import json
import math
import os
import threading
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.gpt2 import GPT2LMHeadModel
from engine.models.llama import LlamaForCausalLM
from engine.models.spec import ModelSpec

DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "default-model"
_WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
DEFAULT_MAX_LOADED_MODELS = 2
# bytes per element of each safetensors dtype (the header names it for every tensor)
SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
                           "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
                           "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
_MAX_HEADER_BYTES = 100 * 1024 * 1024   # the safetensors format's own limit on a header


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


def _safetensors_bytes(file: Path) -> int:
    """Bytes of every tensor in one .safetensors file, from its JSON header (dtype x shape of
    each tensor): the weights themselves are not read."""
    with open(file, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < size <= _MAX_HEADER_BYTES:
            raise ValueError(f"{file.name} is not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"{file.name} is not a safetensors file (bad header)") from None
    total = 0
    try:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            per_item = SAFETENSORS_DTYPE_BYTES.get(info["dtype"])
            if per_item is None:                  # a dtype added after this table: use offsets
                begin, end = info["data_offsets"]
                total += int(end) - int(begin)
            else:
                total += per_item * math.prod(int(d) for d in info["shape"])
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{file.name} is not a safetensors file (bad tensor entry)") from None
    return total


def checkpoint_bytes(path: Path) -> int:
    """Bytes of a checkpoint folder's weights, known without reading them: the safetensors
    headers (the files ``load_model`` would read), else the pytorch_model*.bin file sizes."""
    files = sorted(Path(path).glob("*.safetensors"))
    if files:
        return sum(_safetensors_bytes(f) for f in files)
    return sum(f.stat().st_size for f in sorted(Path(path).glob("pytorch_model*.bin")))


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
_IMPORT_LOCK = threading.Lock()


def hf(name: str):
    """``transformers.<name>``, resolved under a lock: transformers' lazy module is not safe to
    import from several threads at once (sessions opening a freshly started server together got
    "ImportError: cannot import name 'AutoConfig' from 'transformers'"). Imported on first use,
    so the length-only engine never pays for it."""
    with _IMPORT_LOCK:
        import transformers
        return getattr(transformers, name)


def _with_generation_eos(spec: ModelSpec, path: Path) -> ModelSpec:
    """generation_config.json's eos_token_id, when the file sets one, replaces config.json's
    (transformers' generate reads the generation config; both may list several ids)."""
    if not (path / "generation_config.json").exists():
        return spec
    try:
        gen = hf("GenerationConfig").from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}/generation_config.json could not be read: {exc}") from exc
    return spec.with_eos(gen.eos_token_id) if gen.eos_token_id is not None else spec


def read_spec(path: Path) -> ModelSpec:
    """The architecture (layers, KV heads, head size...) from config.json and
    generation_config.json only: no weights are read."""
    spec = ModelSpec.from_hf_config(hf("AutoConfig").from_pretrained(str(path)))
    return _with_generation_eos(spec, Path(path))


def max_loaded_models() -> int:
    """How many models the cache keeps: ``PAGED_LAB_MAX_MODELS``, default 2."""
    raw = os.environ.get("PAGED_LAB_MAX_MODELS", "").strip()
    if not raw:
        return DEFAULT_MAX_LOADED_MODELS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"PAGED_LAB_MAX_MODELS must be an integer >= 1, got {raw!r}")
    return int(raw)


# (model, device, dtype) -> LoadedModel, least recently used first
_LOADED: OrderedDict[tuple[str, str, torch.dtype], LoadedModel] = OrderedDict()


def loaded_models() -> list[tuple[str, str, torch.dtype]]:
    """The cache's keys, least recently used first."""
    with _LOAD_LOCK:
        return list(_LOADED)


def load_model(model: str, device: str, dtype: torch.dtype) -> LoadedModel:
    """Load once per process and share (thread-safe: many browser sessions may start at once).
    Before a new model loads, the least recently used ones are dropped so that at most
    ``max_loaded_models()`` stay cached (an engine still using a dropped one keeps it alive
    until the engine goes)."""
    key = (model, device, dtype)
    with _LOAD_LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
        limit = max_loaded_models()
        while len(_LOADED) >= limit:
            _LOADED.popitem(last=False)
        loaded = _load_model(model, device, dtype)
        _LOADED[key] = loaded
        return loaded


def _load_model(model: str, device: str, dtype: torch.dtype) -> LoadedModel:
    path = resolve_model_path(model)
    spec = read_spec(path)
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
        tokenizer = hf("AutoTokenizer").from_pretrained(str(path))
    return LoadedModel(str(path), spec, net, tokenizer)
