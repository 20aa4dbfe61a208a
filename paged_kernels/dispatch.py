"""Pick the implementation of each paged op for a device, and fall back safely.

Backends
--------
- ``"torch"``: the reference in paged_kernels/reference.py; runs anywhere.
- ``"triton"``: paged_kernels/triton_decode.py, triton_prefill.py, triton_cache_ops.py (swap_blocks
  stays torch: it is a host<->device copy). On CUDA they compile for the GPU. On CPU they run
  under Triton's interpreter, which must be switched on with ``TRITON_INTERPRET=1`` *before* the
  kernels are first imported (triton decides at decoration time); slow, for tests and teaching.
- ``"auto"``: ``"triton"`` on CUDA when triton imports (and the interpreter is not forced),
  otherwise ``"torch"``.

Fallback: ``get_ops(backend, fallback=True)`` wraps the Triton set in ``FallbackOps``. If a
Triton op raises (a kernel that fails to compile on this GPU, a Triton/driver mismatch, a launch
error), the op is re-run with the torch reference on the same tensors, a ``RuntimeWarning``
naming the op and the error is issued once, and that op stays on torch for the life of the
engine. ``label`` then tells what really ran, e.g. ``triton`` or
``torch (triton failed: paged_decode_attention: CompilationError: ...)``. Out-of-memory errors
are not hidden (the reference needs more memory, not less), nor are errors the reference raises
too (bad input). An asynchronous CUDA fault (an illegal address found later) poisons the CUDA
context and cannot be recovered by any fallback.

``BACKENDS`` is what an engine (and the page) may choose, besides ``"auto"``. The first Triton
kernels (paged_kernels/legacy/) are not among them: they are the kernel benchmark's baseline
(bench/kernel_bench.py) and are tested beside the current ones, imported directly.

Triton is optional: nothing here imports it unless a Triton backend is chosen.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, fields
from typing import Callable

from paged_kernels import reference
from paged_kernels.triton_support import interpreting, kernels_interpreted, triton_importable

BACKENDS = ("torch", "triton")             # the choices besides "auto" (see above)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelOps:
    name: str
    store_kv: Callable
    copy_blocks: Callable
    swap_blocks: Callable
    paged_decode_attention: Callable
    paged_prefill_attention: Callable

    @property
    def label(self) -> str:
        return self.name


OP_NAMES = tuple(f.name for f in fields(KernelOps) if f.name != "name")

_TORCH = KernelOps("torch", reference.store_kv, reference.copy_blocks, reference.swap_blocks,
                   reference.paged_decode_attention, reference.paged_prefill_attention)


def _short(err: BaseException, limit: int = 160) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _is_oom(err: BaseException) -> bool:
    import torch
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


class FallbackOps:
    """A Triton op set whose ops fall back, one by one and for good, to the torch reference.

    Invariant: ``failed`` holds exactly the ops that now run on torch, each with the error that
    sent it there; every other op runs the primary (Triton) implementation."""

    def __init__(self, primary: KernelOps, fallback: KernelOps = _TORCH):
        self.primary = primary
        self.fallback = fallback
        self.failed: dict[str, str] = {}
        for op in OP_NAMES:
            setattr(self, op, self._guard(op))

    @property
    def name(self) -> str:
        moved = [op for op in OP_NAMES if getattr(self.primary, op) is not getattr(self.fallback, op)]
        if not self.failed:
            return self.primary.name
        if all(op in self.failed for op in moved):
            return self.fallback.name
        return f"{self.primary.name}+{self.fallback.name}"

    @property
    def label(self) -> str:
        """What ran, for the page: ``triton``, or e.g. ``torch (triton failed: op: error)``."""
        if not self.failed:
            return self.name
        why = "; ".join(f"{op}: {err}" for op, err in self.failed.items())
        return f"{self.name} ({self.primary.name} failed: {why})"

    def _guard(self, op: str) -> Callable:
        primary, fallback = getattr(self.primary, op), getattr(self.fallback, op)
        if primary is fallback:
            return primary

        def run(*args, **kwargs):
            if op in self.failed:
                return fallback(*args, **kwargs)
            try:
                return primary(*args, **kwargs)
            except Exception as err:       # compile / launch failure of the Triton kernel
                if _is_oom(err):
                    raise
                result = fallback(*args, **kwargs)   # bad input raises here too, unchanged
                self.failed[op] = _short(err)
                msg = (f"Triton kernel for {op} failed ({self.failed[op]}); using the torch "
                       f"reference for {op} from now on")
                log.warning(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                return result

        run.__name__ = op
        return run


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
    from paged_kernels import triton_cache_ops, triton_decode, triton_prefill    # import triton
    return KernelOps("triton", triton_cache_ops.store_kv,
                     triton_cache_ops.copy_blocks, reference.swap_blocks,
                     triton_decode.paged_decode_attention, triton_prefill.paged_prefill_attention)


def get_ops(backend: str, fallback: bool = False) -> KernelOps | FallbackOps:
    """The op set of a resolved backend; ``fallback=True`` guards a Triton set (see above)."""
    if backend == "torch":
        return _TORCH
    if backend == "triton":
        if not triton_importable():
            raise ValueError(f"backend={backend!r} needs the triton package (pip install triton)")
        ops = _triton_ops()
        return FallbackOps(ops) if fallback else ops
    raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
