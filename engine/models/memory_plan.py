"""What an engine for a config will take before it is built: the checkpoint's bytes and the KV
cache's, from config.json and the weights' headers only (nothing is loaded or allocated).

The rules are the ones ``runner.ModelRunner.from_config`` builds by (device, dtype, the pools'
shape), so a host can refuse a too-large request without repeating them (app/hosting.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.models import loader
from engine.models.device import resolve_device, resolve_dtype
from engine.models.spec import ModelSpec


def kv_cache_bytes(spec: ModelSpec, dtype_bytes: int, block_size: int, num_blocks: int) -> int:
    """K and V of every layer for ``num_blocks`` blocks: what the engine's KV tensors take."""
    return (2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes
            * block_size * num_blocks)


@dataclass(frozen=True)
class MemoryPlan:
    model_path: Path
    spec: ModelSpec
    checkpoint_bytes: int          # the weights as stored
    device: str
    dtype: torch.dtype
    num_blocks: int                # device + CPU (swap) blocks
    kv_cache_bytes: int            # both pools' K/V tensors
    bytes_per_token_slot: int      # K/V of one token in every layer


@functools.lru_cache(maxsize=16)
def _model_facts(path: str, stamp: tuple) -> tuple:
    """(spec, checkpoint bytes), cached per file version (``stamp``): hosts ask on every Apply."""
    return loader.read_spec(Path(path)), loader.checkpoint_bytes(Path(path))


def _stamp(path: Path) -> tuple:
    return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size)
                 for f in sorted(path.iterdir()) if f.suffix in (".json", ".safetensors", ".bin"))


def checkpoint_facts(model: str) -> tuple[Path, ModelSpec, int]:
    """(folder, spec, checkpoint bytes) of EngineConfig.model; resolves the folder (a hub id
    may be fetched)."""
    path = loader.resolve_model_path(model)
    return (path, *_model_facts(str(path), _stamp(path)))


def memory_plan(config: EngineConfig) -> MemoryPlan:
    """The memory an engine for ``config`` would take; raises ValueError for a device that is
    not here."""
    path, spec, weights = checkpoint_facts(config.model)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    blocks = config.num_gpu_blocks + config.num_cpu_blocks
    return MemoryPlan(path, spec, weights, device, dtype, blocks,
                      kv_cache_bytes(spec, dtype_bytes, config.block_size, blocks),
                      kv_cache_bytes(spec, dtype_bytes, 1, 1))
