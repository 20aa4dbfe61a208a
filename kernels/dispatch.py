"""Pick the implementation of each paged op for a device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kernels import reference

BACKENDS = ("torch",)


@dataclass(frozen=True)
class KernelOps:
    name: str
    store_kv: Callable
    copy_blocks: Callable
    swap_blocks: Callable
    paged_decode_attention: Callable
    paged_prefill_attention: Callable


_TORCH = KernelOps("torch", reference.store_kv, reference.copy_blocks, reference.swap_blocks,
                   reference.paged_decode_attention, reference.paged_prefill_attention)


def resolve_backend(requested: str, device: str) -> str:
    """'auto' -> the best backend for the device; anything unknown is a ValueError."""
    if requested == "auto":
        return "torch"
    if requested not in BACKENDS:
        raise ValueError(f"unknown kernel backend {requested!r}; choose one of {BACKENDS} or 'auto'")
    return requested


def get_ops(backend: str) -> KernelOps:
    if backend == "torch":
        return _TORCH
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
