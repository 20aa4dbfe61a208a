"""Helpers for the kernel tests: random paged caches and tolerances."""
import pytest
import torch

from engine.core.block_math import cdiv
from paged_kernels.triton_support import triton_importable

needs_triton = pytest.mark.skipif(not triton_importable(), reason="triton not installed")


def paged_setup(lengths, block_size, hkv, d, dtype, device, seed, extra_cols=0):
    """Random caches; each sequence in random, non-contiguous physical blocks (padding 0)."""
    gen = torch.Generator().manual_seed(seed)
    need = [cdiv(n, block_size) for n in lengths]
    num_blocks = sum(need) + 5
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(need) + extra_cols
    table = [[perm.pop() for _ in range(n)] for n in need]
    table = torch.tensor([t + [0] * (width - len(t)) for t in table], dtype=torch.int32)
    return k_cache.to(device), v_cache.to(device), table.to(device), gen


# fp32: exact products (IEEE dots); fp16: rounding of the output; bf16: 8 mantissa bits, and on a
# GPU the P.V product runs in bf16 too
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def close(got, want, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=tol, atol=tol)
