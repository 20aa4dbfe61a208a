"""Paged decode attention in Triton: split-K ("flash-decoding") + a small merge kernel.

Same signature and result as ``paged_kernels.reference.paged_decode_attention``.

Grid ``(sequence, kv_head, split)``. A split owns ``tiles_per_split`` token tiles of its
sequence's context and folds them with ``attend_tiles`` (paged_kernels/triton_tile_loop.py): whole
tiles first without any mask, then the one partial tile at the end with a key mask. Each tile
loads one page id per page it covers, not one per token, and gathers K/V rows at
``page * stride_block + slot * stride_slot``; the token tile is independent of the page size,
so any power-of-two block size works (1, 2, 4, ... as well as 16, 32).

GQA: one program serves all ``group = q_heads / kv_heads`` query heads of its KV head, so each
K/V tile is loaded once. The group is padded to ``BLOCK_G >= 16`` rows (and the head dim to
``>= 16`` columns) so ``tl.dot`` gets tiles a GPU's tensor cores accept; padding rows are zeros
and are never stored.

The number of splits is sized from the longest *live* context (``max_context``, a host int the
engine already has), not from the padded block-table width, so a wide table costs no empty
programs and no host<->device sync is needed. Each split writes its normalised partial output
and its log-sum-exp (base 2); the merge kernel combines the splits of one (sequence, query
head) weighted by ``exp2(lse - max lse)``. A split past the end of a short sequence is empty:
it writes lse = -inf and weight 0, and the merge guards the all-empty case (-inf - -inf would
be NaN). With a single split the kernel writes the final output directly and no merge runs.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from paged_kernels.triton_support import next_pow2
from paged_kernels.triton_tile_loop import attend_tiles

MAX_SPLITS = 64            # the merge kernel holds [next_pow2(splits), head_dim] in registers
MIN_TILES_PER_SPLIT = 4    # a split below ~256 tokens costs more in launch/merge than it saves


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
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    DIRECT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    ctx_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, ctx_len)
    full_end = tl.maximum(start, start + (end - start) // BLOCK_N * BLOCK_N)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
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
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    # whole tiles: every key visible, no masks; then the partial last tile (if any), masked
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, offs_g, k_base, v_base, table_row,
                                 start, full_end, stride_kb, stride_ks, stride_vb, stride_vs,
                                 offs_d, d_mask, scale_log2e, BLOCK_SIZE, BLOCK_N,
                                 HEAD_DIM == BLOCK_D, False, False, UPCAST, IEEE)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, offs_g, k_base, v_base, table_row,
                                 full_end, end, stride_kb, stride_ks, stride_vb, stride_vs,
                                 offs_d, d_mask, scale_log2e, BLOCK_SIZE, BLOCK_N,
                                 HEAD_DIM == BLOCK_D, True, False, UPCAST, IEEE)

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


@triton.jit
def _decode_merge_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, num_splits,
    stride_os, stride_oh, stride_ps, stride_ph, stride_pk, stride_ls, stride_lh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    k_mask = offs_k < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(part_lse_ptr + seq * stride_ls + head * stride_lh + offs_k, mask=k_mask,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)      # every split empty: all weights become 0
    w = tl.exp2(lse - m)                          # empty split: exp2(-inf) = 0, never NaN
    denom = tl.sum(w, 0)
    parts = tl.load(part_out_ptr + seq * stride_ps + head * stride_ph
                    + offs_k[:, None] * stride_pk + offs_d[None, :],
                    mask=k_mask[:, None] & d_mask[None, :], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d,
             o.to(out_ptr.dtype.element_ty), mask=d_mask)


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def choose_num_splits(num_programs: int, num_tiles: int, device: torch.device) -> int:
    """Enough splits to give the GPU ~4 programs per SM, each with >= MIN_TILES_PER_SPLIT tiles.

    On CPU (the interpreter) splits of 2 tiles, so moderate test contexts exercise the merge.
    """
    if device.type != "cuda":
        return max(1, min(MAX_SPLITS, triton.cdiv(num_tiles, 2)))
    want = triton.cdiv(4 * _num_sms(device), max(1, num_programs))
    most = max(1, num_tiles // MIN_TILES_PER_SPLIT)
    return max(1, min(want, most, MAX_SPLITS))


def split_plan(num_seqs: int, kv_heads: int, max_context: int, head_dim: int,
               device: torch.device, num_splits: int | None = None,
               block_n: int | None = None) -> tuple[int, int, int]:
    """(token tile, number of splits, tiles per split) the decode kernel will use."""
    if block_n is None:
        block_n = 16 if device.type == "cpu" else (64 if next_pow2(head_dim) <= 128 else 32)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16 (tl.dot tiles on GPUs), got {block_n}")
    num_tiles = max(1, triton.cdiv(max_context, block_n))
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs * kv_heads, num_tiles, device)
    num_splits = max(1, min(int(num_splits), num_tiles, MAX_SPLITS))
    tiles_per_split = triton.cdiv(num_tiles, num_splits)
    return block_n, triton.cdiv(num_tiles, tiles_per_split), tiles_per_split


def max_live_context(context_lens: torch.Tensor, max_context: int | None) -> int:
    """The longest context to plan splits for: the host value when the caller has it (the
    engine does), else the tensor's max (a device->host sync)."""
    if max_context is not None:
        return int(max_context)
    return int(context_lens.max()) if context_lens.numel() else 1   # one sync, callers avoid it


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, max_context: int | None = None, *,
                           num_splits: int | None = None,
                           block_n: int | None = None) -> torch.Tensor:
    """Drop-in for the reference. ``max_context``: the longest context in ``context_lens``
    (host int; sizes the split count). ``num_splits`` / ``block_n`` override the heuristics
    (tests, benchmarks)."""
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
    longest = max(1, max_live_context(context_lens, max_context))
    block_n, num_splits, tiles_per_split = split_plan(s, hkv, longest, d, q.device, num_splits,
                                                      block_n)
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


def split_buffers(out: torch.Tensor, num_splits: int):
    """(partial outputs, partial log-sum-exps, their strides) for ``num_splits`` > 1; with one
    split the kernel writes ``out`` directly and these are unused placeholders."""
    if num_splits == 1:
        return out, out, (0, 0, 0), (0, 0)
    s, hq, d = out.shape
    part_out = torch.empty((s, hq, num_splits, d), dtype=torch.float32, device=out.device)
    part_lse = torch.empty((s, hq, num_splits), dtype=torch.float32, device=out.device)
    return part_out, part_lse, part_out.stride()[:3], part_lse.stride()[:2]


def merge_splits(out, part_out, part_lse, num_splits, ps, ls, d, block_d) -> None:
    """Combine the splits' partial outputs into ``out`` (one program per sequence, query head)."""
    s, hq = out.shape[:2]
    _decode_merge_kernel[(s, hq)](
        out, part_out, part_lse, num_splits,
        out.stride(0), out.stride(1), ps[0], ps[1], ps[2], ls[0], ls[1],
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_SPLITS=max(2, next_pow2(num_splits)),
        num_warps=4,
    )
