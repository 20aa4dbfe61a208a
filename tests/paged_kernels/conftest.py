"""Shared by the kernel tests: the interpreter switch, the device fixture, random paged caches.

Without CUDA, TRITON_INTERPRET=1 is set here, before any test module imports a Triton kernel
(triton decides at decoration time whether ``@triton.jit`` compiles or interprets).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from paged_kernels.triton_support import interpreting, triton_importable, triton_version  # noqa: E402

def _interpreter_broken() -> str | None:
    """triton < 3.9 + numpy >= 2.4 breaks loops with bounds loaded from memory (triton #9171)."""
    import numpy as np
    tv = tuple(int(x) for x in (triton_version() or "0.0").split(".")[:2])
    nv = tuple(int(x) for x in np.__version__.split(".")[:2])
    if tv < (3, 9) and nv >= (2, 4):
        return (f"triton {triton_version()} interpreter + numpy {np.__version__} is broken "
                "(triton issue #9171): use triton>=3.9 or numpy<2.4")
    return None


@pytest.fixture(params=["interpreter", "cuda"])
def device(request):
    if not triton_importable():
        pytest.skip("triton not installed")
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA")
        if interpreting():
            pytest.skip("TRITON_INTERPRET=1 is set: the kernels run in the interpreter, not on the GPU")
        return "cuda"
    if not interpreting():
        pytest.skip("interpreter tests run where CUDA is absent (or with TRITON_INTERPRET=1 set "
                    "before Python starts)")
    broken = _interpreter_broken()
    if broken:
        pytest.skip(broken)
    return "cpu"


@pytest.fixture(params=["current", "legacy"])
def tk(request):
    """The Triton kernel modules (current, and the legacy decode/prefill: the kernel benchmark's
    baseline), imported once the interpreter switch is settled."""
    from paged_kernels import triton_cache_ops
    if request.param == "legacy":
        from paged_kernels.legacy import triton_decode, triton_prefill
    else:
        from paged_kernels import triton_decode, triton_prefill
    return triton_decode, triton_prefill, triton_cache_ops


@pytest.fixture
def cache_ops():
    """paged_kernels/triton_cache_ops.py (store_kv, copy_blocks), imported once the switch is set."""
    from paged_kernels import triton_cache_ops
    return triton_cache_ops
