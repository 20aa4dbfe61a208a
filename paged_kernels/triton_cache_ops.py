"""Writing into the paged cache in Triton: store K/V into slots, and batched copy_blocks (CoW).

Same signatures and results as ``paged_kernels.reference.store_kv`` / ``copy_blocks``.
``swap_blocks`` moves data between devices, which is a plain torch copy (see reference.py).

store_kv: grid ``(token, chunk of heads*head_dim)``; token t goes to flat slot
``slot_mapping[t]`` = ``block * block_size + offset``. A negative slot means "padding, skip"
(vLLM's convention; the engine never produces one).

copy_blocks: grid ``(pair, layer*2 + k/v, chunk)``; every (src, dst) pair of every layer's K
and V is copied by one launch. The pairs run in parallel, so no dst may also be a src of the
same batch -- true for CoW, whose destinations are freshly allocated blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels import reference
from paged_kernels.triton_support import next_pow2


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch,
    stride_vcb, stride_vcs, stride_vch,
    HEAD_DIM: tl.constexpr, NUM_ELEMS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # (broadcast the scalar test to a block: the interpreter rejects block & scalar masks)
    mask = (offs < NUM_ELEMS) & (slot + tl.zeros([BLOCK], tl.int64) >= 0)
    h = (offs // HEAD_DIM).to(tl.int64)
    d = offs % HEAD_DIM
    blk = slot // BLOCK_SIZE
    pos = slot % BLOCK_SIZE
    k = tl.load(k_ptr + tok * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + blk * stride_kcb + pos * stride_kcs + h * stride_kch + d,
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + blk * stride_vcb + pos * stride_vcs + h * stride_vch + d,
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    t, h, d = k.shape
    if t == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    n = h * d
    block = min(next_pow2(n), 4096 if k.device.type == "cpu" else 1024)
    _store_kv_kernel[(t, triton.cdiv(n, block))](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=d, NUM_ELEMS=n, BLOCK_SIZE=k_cache.shape[1], BLOCK=block,
        num_warps=4,
    )


@triton.jit
def _copy_blocks_kernel(cache_ptr, src_ptr, dst_ptr, stride_lkv, stride_block, block_numel,
                        CHUNK: tl.constexpr):
    pair = tl.program_id(0)
    lkv = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    base = cache_ptr + lkv * stride_lkv
    x = tl.load(base + src * stride_block + offs, mask=mask)
    tl.store(base + dst * stride_block + offs, x, mask=mask)


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """kv_cache: [num_layers, 2, num_blocks, block_size, kv_heads, head_dim]; one launch."""
    pairs = src.numel()
    if pairs == 0:
        return
    layers, two, nb = kv_cache.shape[:3]
    block_numel = kv_cache[0, 0, 0].numel()
    inner_dense = kv_cache[0, 0].is_contiguous()
    mergeable = kv_cache.stride(0) == two * kv_cache.stride(1) or layers == 1
    if not (inner_dense and mergeable):
        reference.copy_blocks(kv_cache, src, dst)     # unusual layout: let torch handle it
        return
    chunk = min(next_pow2(block_numel), 8192 if kv_cache.device.type == "cpu" else 1024)
    src = src.to(device=kv_cache.device).contiguous()
    dst = dst.to(device=kv_cache.device).contiguous()
    _copy_blocks_kernel[(pairs, layers * two, triton.cdiv(block_numel, chunk))](
        kv_cache, src, dst, kv_cache.stride(1), kv_cache.stride(2), block_numel,
        CHUNK=chunk, num_warps=4,
    )
