"""The online-softmax loop over paged K/V tiles that decode and prefill attention share.

``attend_tiles`` walks key positions ``[lo, hi)`` of one sequence in tiles of ``BLOCK_N`` and
folds each tile into a running (max, sum, accumulator) triple -- FlashAttention's online
softmax, in base 2 (``scale_log2e`` already holds ``scale * log2(e)``). ``q`` is a tile of
``ROWS`` query rows (decode: the query heads of one KV head; prefill: tokens x heads of one KV
head), so every K/V tile is read once for all of them (GQA).

How a tile finds its K/V (one page id per page, never one per token):
- ``PAGES == 1`` (a page holds at least a tile, ``BLOCK_SIZE >= BLOCK_N``): the tile lies inside
  one page, because tiles start at multiples of ``BLOCK_N`` and both are powers of two. One
  scalar load of the page id; the slots are ``tok0 % BLOCK_SIZE + [0, BLOCK_N)``.
- ``PAGES > 1`` (small pages): the tile spans ``PAGES = BLOCK_N / BLOCK_SIZE`` whole pages; a
  vector of ``PAGES`` page ids is loaded and expanded to ``[PAGES, BLOCK_SIZE]`` offsets, then
  flattened to the tile's ``BLOCK_N`` rows.
Offsets are int64 (``page * stride`` overflows int32 on a large pool).

``MASKED=False`` is the fast path for tiles the caller knows are entirely visible to every row
(inside ``[lo, hi)`` and at or before every row's position): no key mask, no causal mask.
``MASKED=True`` masks keys at ``>= hi`` and, with ``CAUSAL``, keys after each row's ``q_pos``.
A row that sees no key yet keeps m = -inf; ``m_safe`` keeps exp2 away from -inf - -inf = NaN.

Under the interpreter (CPU tensors) operands are upcast to fp32 before ``tl.dot``: the
interpreter's bf16 dot is wrong (triton issue #11584). fp32 inputs use IEEE products, not TF32.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_offsets(table_row, tok0, hi, stride_b, stride_s,
                  BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PAGES: tl.constexpr,
                  MASKED: tl.constexpr):
    """int64 offsets (page * stride_b + slot * stride_s) of the BLOCK_N tokens from tok0."""
    if PAGES == 1:
        page = tl.load(table_row + tok0 // BLOCK_SIZE).to(tl.int64)
        slot = (tok0 % BLOCK_SIZE + tl.arange(0, BLOCK_N)).to(tl.int64)
        return page * stride_b + slot * stride_s
    else:
        offs_p = tl.arange(0, PAGES)
        first = tok0 // BLOCK_SIZE
        if MASKED:
            pages = tl.load(table_row + first + offs_p, mask=tok0 + offs_p * BLOCK_SIZE < hi,
                            other=0).to(tl.int64)
        else:
            pages = tl.load(table_row + first + offs_p).to(tl.int64)
        slot = tl.arange(0, BLOCK_SIZE).to(tl.int64)
        return tl.reshape(pages[:, None] * stride_b + slot[None, :] * stride_s, [BLOCK_N])


@triton.jit
def attend_tiles(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, lo, hi,
                 stride_kb, stride_ks, stride_vb, stride_vs, offs_d, d_mask, scale_log2e,
                 BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """Fold key positions [lo, hi) into (acc, l_i, m_i); returns the updated triple."""
    PAGES: tl.constexpr = (BLOCK_N + BLOCK_SIZE - 1) // BLOCK_SIZE   # pages one tile spans
    offs_n = tl.arange(0, BLOCK_N)
    for tok0 in range(lo, hi, BLOCK_N):
        k_off = _tile_offsets(table_row, tok0, hi, stride_kb, stride_ks,
                              BLOCK_SIZE, BLOCK_N, PAGES, MASKED)
        v_off = _tile_offsets(table_row, tok0, hi, stride_vb, stride_vs,
                              BLOCK_SIZE, BLOCK_N, PAGES, MASKED)
        pos = tok0 + offs_n
        if MASKED:
            kv_mask = (pos < hi)[:, None] & d_mask[None, :]
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :])
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :])
        else:
            k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=d_mask[None, :], other=0.0)
            v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=d_mask[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        qk = qk * scale_log2e
        if MASKED:
            visible = (pos < hi)[None, :]
            if CAUSAL:
                visible = visible & (pos[None, :] <= q_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i
