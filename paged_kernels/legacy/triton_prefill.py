"""Paged-context prefill attention in Triton.

Same signature and result as ``paged_kernels.reference.paged_prefill_attention``: sequence i's new
tokens are rows ``query_start[i]:query_start[i+1]`` of ``q`` and are the *last* of its
``context_lens[i]`` tokens; their K/V were already stored. Every new token attends, causally,
to the whole cached context (e.g. a prefix-cache hit) and to the new tokens up to itself, all
read through the block table (never from a contiguous copy).

Grid ``(sequence, query tile, query head)``; a program owns ``BLOCK_M`` new tokens of one query
head and walks the key positions ``[0, last query position]`` in tiles of ``BLOCK_N``,
gathering each position's page from the block table as a vector (any block size works).
The causal mask is ``key_pos <= query_pos`` with ``query_pos = context_len - n_new + row``.
Tiles are >= 16 in every ``tl.dot`` dimension (head dim padded), offsets are int64, and under
the interpreter operands are cast to fp32 before ``tl.dot``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels.triton_prefill import _meta_tensors   # shared host side
from paged_kernels.triton_support import next_pow2


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_ptr, context_lens_ptr, out_ptr,
    scale_log2e,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bts,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    m_tile = tl.program_id(1)
    head = tl.program_id(2).to(tl.int64)
    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    n_new = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_start
    if m_tile * BLOCK_M >= n_new:
        return
    ctx_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    kvh = head // GROUP

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)      # row among this sequence's new tokens
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < n_new
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx_len - n_new + offs_m                        # absolute position of each query
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq * stride_bts
    # keys past the tile's last query position are masked for every row: stop there
    hi = tl.minimum(ctx_len - n_new + (m_tile + 1) * BLOCK_M, ctx_len)

    for tok0 in range(0, hi, BLOCK_N):
        pos = tok0 + offs_n
        n_mask = pos < hi
        page = tl.load(table_row + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = (pos % BLOCK_SIZE).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + (page * stride_kb + slot * stride_ks + kvh * stride_kh)[:, None]
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + (page * stride_vb + slot * stride_vs + kvh * stride_vh)[:, None]
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:   # fp32 inputs: exact products, not TF32
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = qk * scale_log2e
        allowed = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        qk = tl.where(allowed, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing visible yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start, context_lens,
                            scale: float, *, block_m: int | None = None,
                            block_n: int | None = None) -> torch.Tensor:
    """Drop-in for the reference (``query_start``/``context_lens`` host lists, as the engine
    passes them; int tensors are accepted too)."""
    t, hq, d = q.shape
    hkv = k_cache.shape[2]
    bs = k_cache.shape[1]
    assert hq % hkv == 0 and k_cache.shape[3] == d
    out = torch.empty_like(q)
    num_seqs = len(query_start) - 1
    if t == 0 or num_seqs <= 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    interp = q.device.type == "cpu"
    block_d = max(16, next_pow2(d))
    if block_m is None:
        block_m = 16 if interp else (64 if block_d <= 128 else 32)
    if block_n is None:
        block_n = 16 if interp else (32 if block_d <= 128 else 16)
    qs_list = query_start.tolist() if isinstance(query_start, torch.Tensor) else query_start
    max_new = max(qs_list[i + 1] - qs_list[i] for i in range(num_seqs))
    qs_t, ctx_t = _meta_tensors(query_start, context_lens, q.device)
    grid = (num_seqs, triton.cdiv(max(1, max_new), block_m), hq)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, qs_t, ctx_t, out,
        float(scale) * 1.4426950408889634,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_SIZE=bs,
        BLOCK_M=block_m, BLOCK_N=block_n, UPCAST=interp, IEEE=q.dtype == torch.float32,
        num_warps=4,
    )
    return out
