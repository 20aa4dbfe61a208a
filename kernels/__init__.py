"""Tensor ops on a paged KV cache. No engine imports.

``ops(backend)`` returns the implementation set; today only the torch reference exists
(the Triton kernels are added behind the same names).
"""
from kernels.dispatch import BACKENDS, KernelOps, get_ops, resolve_backend

__all__ = ["BACKENDS", "KernelOps", "get_ops", "resolve_backend"]
