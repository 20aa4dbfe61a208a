"""Paged decode attention in Triton: split-K ("flash-decoding") + a small merge kernel.

Same signature and result as ``paged_kernels.reference.paged_decode_attention``. The previous kernel,
kept as the kernel benchmark's baseline for paged_kernels/triton_decode.py (no engine backend):
it loads one page id per *token* and sizes its splits from the padded block-table width.

How it reads the paged cache
----------------------------
Grid ``(sequence, kv_head, split)``. A split owns ``tiles_per_split`` token tiles of its
sequence's context. For each tile of ``BLOCK_N`` token positions the program gathers the
physical page of every position as a vector (``tl.load(block_table + pos // BLOCK_SIZE)``) and
then the K/V rows at ``page * stride_block + (pos % BLOCK_SIZE) * stride_slot``: the token tile
is independent of the page size, so any block size works (1, 2, 4, ... as well as 8, 16, 32).
Offsets are int64: ``page * stride_block`` overflows int32 on a large pool.

GQA: one program serves all ``group = q_heads / kv_heads`` query heads of its KV head, so each
K/V tile is loaded once. The group is padded to ``BLOCK_G >= 16`` rows (and the head dim to
``>= 16`` columns) so ``tl.dot`` gets tiles a GPU's tensor cores accept; padding rows are zeros
and are never stored.

Each split writes its normalised partial output and its log-sum-exp (base 2); the merge kernel
combines the splits of one (sequence, query head) weighted by ``exp2(lse - max lse)``. A split
that starts past the end of a short sequence is empty: it writes lse = -inf and weight 0, and
the merge guards the all-empty case (-inf - -inf would be NaN). With a single split the
kernel writes the final output directly and no merge runs.

Under the Triton interpreter (CPU tensors) operands are cast to fp32 before ``tl.dot``
(the interpreter's bf16 dot is wrong, triton issue #11584).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels.triton_decode import merge_splits, split_buffers, split_plan   # shared host side
from paged_kernels.triton_support import next_pow2

@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2e, tiles_per_split,
    stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bts,
    stride_os, stride_oh,
    stride_ps, stride_ph, stride_pk,
    stride_ls, stride_lh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    ctx_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g                                   # int64 query-head ids

    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq * stride_bts

    for tok0 in range(start, end, BLOCK_N):
        pos = tok0 + offs_n
        n_mask = pos < end
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
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0                       # False for an empty split (or padded rows of one)
    safe_l = tl.where(has, l_i, 1.0)
    o = acc / safe_l[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        lse = tl.where(has, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_out_ptr + seq * stride_ps + heads[:, None] * stride_ph + split * stride_pk
                 + offs_d[None, :], o, mask=out_mask)
        tl.store(part_lse_ptr + seq * stride_ls + heads * stride_lh + split, lse, mask=g_mask)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, max_context: int | None = None, *,
                           num_splits: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """Drop-in for the reference (``max_context`` is accepted and ignored: the split count is
    sized from the block table's width). ``num_splits`` / ``block_n`` override the heuristics."""
    s, hq, d = q.shape
    nb, bs, hkv, dk = k_cache.shape
    assert dk == d and hq % hkv == 0, "q heads must be a multiple of kv heads, same head_dim"
    out = torch.empty_like(q)
    if s == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    interp = q.device.type == "cpu"
    group = hq // hkv
    block_g = max(16, next_pow2(group))
    block_d = max(16, next_pow2(d))
    block_n, num_splits, tiles_per_split = split_plan(s, hkv, block_tables.shape[1] * bs, d,
                                                      q.device, num_splits, block_n)
    direct = num_splits == 1
    part_out, part_lse, ps, ls = split_buffers(out, num_splits)
    _decode_split_kernel[(s, hkv, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens,
        out, part_out, part_lse,
        float(scale) * 1.4426950408889634, tiles_per_split,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        ps[0], ps[1], ps[2],
        ls[0], ls[1],
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_SIZE=bs, BLOCK_N=block_n, DIRECT=direct,
        UPCAST=interp, IEEE=q.dtype == torch.float32,
        num_warps=4,
    )
    if not direct:
        merge_splits(out, part_out, part_lse, num_splits, ps, ls, d, block_d)
    return out
