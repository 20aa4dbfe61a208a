"""Triton is optional: find out whether it can be used, without importing any kernel.

Two facts drive the dispatcher:

- ``triton_importable()``: the package imports (the CPU build of torch does not depend on it).
- ``interpreting()``: ``TRITON_INTERPRET=1`` is set. Triton decides *when a kernel is decorated*
  (i.e. when ``paged_kernels.triton_*`` is first imported) whether ``@triton.jit`` compiles for the GPU
  or runs on CPU tensors through its interpreter, so the variable has to be set before that
  import. ``kernels_interpreted()`` tells what the already-imported kernels actually do.
"""
from __future__ import annotations

import functools
import os
import sys

_TRUE = ("1", "true", "on", "yes", "y")


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks for the interpreter (as triton itself reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


@functools.lru_cache(maxsize=1)
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:   # not installed, or a broken install: the torch reference still works
        return False
    return True


def triton_version() -> str | None:
    if not triton_importable():
        return None
    import triton
    return triton.__version__


# one @triton.jit function of each kernel module: how it was decorated tells how all were
_PROBES = (("paged_kernels.triton_tile_loop", "attend_tiles"),
           ("paged_kernels.triton_cache_ops", "_store_kv_kernel"),
           ("paged_kernels.legacy.triton_decode", "_decode_split_kernel"))


def kernels_interpreted() -> bool | None:
    """How the Triton kernels were built: True = interpreter, False = GPU JIT, None = not yet
    imported (the next import follows ``interpreting()``)."""
    for module, name in _PROBES:
        mod = sys.modules.get(module)
        if mod is not None:
            from triton.runtime.interpreter import InterpretedFunction
            return isinstance(getattr(mod, name), InterpretedFunction)
    return None


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
