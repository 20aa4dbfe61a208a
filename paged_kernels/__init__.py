"""Tensor ops on a paged KV cache. No engine imports.

``get_ops(resolve_backend(backend, device))`` returns the implementation set: the torch
reference (reference.py) or the Triton kernels (triton_decode.py, triton_prefill.py,
triton_cache_ops.py), behind the same names and signatures. Triton is an optional import.
"""
from paged_kernels.dispatch import BACKENDS, KernelOps, get_ops, resolve_backend

__all__ = ["BACKENDS", "KernelOps", "get_ops", "resolve_backend"]
