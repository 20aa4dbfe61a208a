"""Pick the implementation of each paged op for a device.

Backends
--------
- ``"torch"``: the reference in kernels/reference.py; runs anywhere.
- ``"triton"``: kernels/triton_decode.py, triton_prefill.py, triton_cache_ops.py (swap_blocks
  stays torch: it is a host<->device copy). On CUDA they compile for the GPU. On CPU they run
  under Triton's interpreter, which must be switched on with ``TRITON_INTERPRET=1`` *before* the
  kernels are first imported (triton decides at decoration time); slow, for tests and teaching.
- ``"auto"``: ``"triton"`` on CUDA when triton imports (and the interpreter is not forced),
  otherwise ``"torch"``.

Triton is optional: nothing here imports it unless the ``"triton"`` backend is chosen.
The Triton kernels accept every power-of-two block size (the token tile is independent of the
page size), including the tiny ones (1, 2, 4) the engine allows for teaching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kernels import reference
from kernels.triton_support import interpreting, kernels_interpreted, triton_importable

BACKENDS = ("torch", "triton")


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


def _check_triton(device: str) -> None:
    """ValueError with a student-readable reason if the Triton kernels cannot run on device."""
    if not triton_importable():
        raise ValueError("backend='triton' needs the triton package (pip install triton); "
                         "use backend='torch' or 'auto'")
    on_cuda = str(device).startswith("cuda")
    if not on_cuda:
        if not interpreting():
            raise ValueError("backend='triton' on a CPU device runs the kernels in Triton's "
                             "interpreter: set the environment variable TRITON_INTERPRET=1 before "
                             "starting Python, or use backend='torch' / 'auto'")
        if kernels_interpreted() is False:
            raise ValueError("the Triton kernels were already compiled for the GPU in this process "
                             "(TRITON_INTERPRET was set too late); restart Python with "
                             "TRITON_INTERPRET=1 to run them on CPU")


def resolve_backend(requested: str, device: str) -> str:
    """'auto' -> the best backend for the device; unknown or unusable -> ValueError."""
    if requested == "auto":
        on_cuda = str(device).startswith("cuda")
        if on_cuda and triton_importable() and not interpreting():
            return "triton"
        return "torch"
    if requested not in BACKENDS:
        raise ValueError(f"unknown kernel backend {requested!r}; choose one of {BACKENDS} or 'auto'")
    if requested == "triton":
        _check_triton(device)
    return requested


def _triton_ops() -> KernelOps:
    from kernels import triton_cache_ops, triton_decode, triton_prefill   # imports triton
    return KernelOps("triton", triton_cache_ops.store_kv, triton_cache_ops.copy_blocks,
                     reference.swap_blocks, triton_decode.paged_decode_attention,
                     triton_prefill.paged_prefill_attention)


def get_ops(backend: str) -> KernelOps:
    if backend == "torch":
        return _TORCH
    if backend == "triton":
        if not triton_importable():
            raise ValueError("backend='triton' needs the triton package (pip install triton)")
        return _triton_ops()
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
