"""Paged-context prefill attention in Triton.

Same signature and result as ``paged_kernels.reference.paged_prefill_attention``: sequence i's new
tokens are rows ``query_start[i]:query_start[i+1]`` of ``q`` and are the *last* of its
``context_lens[i]`` tokens; their K/V were already stored. Every new token attends, causally,
to the whole cached context (e.g. a prefix-cache hit) and to the new tokens up to itself, all
read through the block table (never from a contiguous copy).

Grid ``(sequence, query tile, kv_head)``. As in decode, one program serves a KV head's whole
query group: its Q tile is ``BLOCK_M`` new tokens x ``GROUP_P`` query heads (the group padded
to a power of two), row ``r`` = token ``r // GROUP_P``, head ``r % GROUP_P``, so each K/V tile
is read once for the whole group. Keys are walked in two stages with ``attend_tiles``
(paged_kernels/triton_tile_loop.py):

1. the unmasked loop: key tiles that end at or before the tile's first query position are
   visible to every row, so no causal or bounds mask is computed;
2. the diagonal stage: the remaining tiles up to the tile's last query position, with the
   causal mask ``key_pos <= query_pos`` (``query_pos = context_len - n_new + token``).

On a GPU the tile sizes, warps and pipeline stages come from ``triton.autotune`` (a few
configurations, tuned once per head dim / group / page size / prompt-length bucket; the first
prefill of each new shape pays for the tuning). Under the interpreter a fixed small tile is
used (autotuning would benchmark Python). Tiles are >= 16 in every ``tl.dot`` dimension.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels.triton_support import next_pow2
from paged_kernels.triton_tile_loop import attend_tiles


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_ptr, context_lens_ptr, out_ptr,
    scale_log2e, max_new_bucket,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bts,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    m_tile = tl.program_id(1)
    kvh = tl.program_id(2).to(tl.int64)
    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    n_new = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_start
    if m_tile * BLOCK_M >= n_new:
        return
    ctx_len = tl.load(context_lens_ptr + seq).to(tl.int32)

    ROWS: tl.constexpr = BLOCK_M * GROUP_P
    offs_r = tl.arange(0, ROWS)
    tok = m_tile * BLOCK_M + offs_r // GROUP_P             # row's token among the new tokens
    g = offs_r % GROUP_P
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    r_mask = (tok < n_new) & (g < GROUP)
    q_pos = ctx_len - n_new + tok                          # absolute position of each row
    rows = (q_start + tok).to(tl.int64)
    heads = kvh * GROUP + g
    q_offs = rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=r_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq * stride_bts
    k_base = k_cache_ptr + kvh * stride_kh
    v_base = v_cache_ptr + kvh * stride_vh
    first_q = ctx_len - n_new + m_tile * BLOCK_M           # the tile's first query position
    hi = tl.minimum(first_q + BLOCK_M, ctx_len)            # one past its last query position
    unmasked_end = (first_q + 1) // BLOCK_N * BLOCK_N      # keys <= first_q: seen by every row
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row,
                                 0, unmasked_end, stride_kb, stride_ks, stride_vb, stride_vs,
                                 offs_d, d_mask, scale_log2e, BLOCK_SIZE, BLOCK_N, HEAD_DIM == BLOCK_D,
                                 False, False, UPCAST, IEEE)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row,
                                 unmasked_end, hi, stride_kb, stride_ks, stride_vb, stride_vs,
                                 offs_d, d_mask, scale_log2e, BLOCK_SIZE, BLOCK_N, HEAD_DIM == BLOCK_D,
                                 True, True, UPCAST, IEEE)

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_offs = rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty),
             mask=r_mask[:, None] & d_mask[None, :])


def _gpu_configs() -> list:
    """A few tile / warp / stage choices; ``_prune`` drops the ones too big for the shape."""
    out = []
    for bm, bn, warps, stages in [(16, 32, 4, 2), (16, 64, 4, 3), (32, 32, 4, 2),
                                  (32, 64, 8, 3), (64, 32, 4, 2), (64, 64, 8, 3)]:
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps,
                                 num_stages=stages))
    return out


def _prune(configs, named_args, **kwargs):
    """Keep Q tiles (tokens x padded group) of >= 16 rows whose fp32 accumulator stays within
    128 x 128 (more spills registers), and small key tiles for big heads; one always survives."""
    group_p = kwargs.get("GROUP_P", named_args.get("GROUP_P", 1))
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D", 128))
    keep = [c for c in configs
            if c.kwargs["BLOCK_M"] * group_p >= 16
            and c.kwargs["BLOCK_M"] * group_p * block_d <= 128 * 128
            and (block_d <= 128 or c.kwargs["BLOCK_N"] <= 32)]
    return keep or configs[:1]


_prefill_tuned = triton.autotune(
    configs=_gpu_configs(),
    key=["max_new_bucket", "GROUP_P", "HEAD_DIM", "BLOCK_SIZE"],
    prune_configs_by={"early_config_prune": _prune},
)(_prefill_kernel)


_HOST_META: dict = {}   # (query_start, context_lens, device) -> device tensors; one entry


def _meta_tensors(query_start, context_lens, device):
    """The host lists as int32 device tensors. Every layer of one forward pass passes the same
    lists, so one cached entry saves a host->device copy per layer."""
    if isinstance(query_start, torch.Tensor) and isinstance(context_lens, torch.Tensor):
        return query_start.to(device=device, dtype=torch.int32), \
            context_lens.to(device=device, dtype=torch.int32)
    key = (tuple(int(x) for x in query_start), tuple(int(x) for x in context_lens), str(device))
    hit = _HOST_META.get(key)
    if hit is None:
        hit = (torch.tensor(key[0], dtype=torch.int32, device=device),
               torch.tensor(key[1], dtype=torch.int32, device=device))
        _HOST_META.clear()
        _HOST_META[key] = hit
    return hit


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start, context_lens,
                            scale: float, *, block_m: int | None = None,
                            block_n: int | None = None) -> torch.Tensor:
    """Drop-in for the reference (``query_start``/``context_lens`` host lists, as the engine
    passes them; int tensors are accepted too). ``block_m`` (new tokens per program) and
    ``block_n`` (keys per tile) fix the tiles instead of autotuning (tests, benchmarks)."""
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
    group = hq // hkv
    group_p = next_pow2(group)
    block_d = max(16, next_pow2(d))
    qs_list = query_start.tolist() if isinstance(query_start, torch.Tensor) else query_start
    max_new = max(qs_list[i + 1] - qs_list[i] for i in range(num_seqs))
    qs_t, ctx_t = _meta_tensors(query_start, context_lens, q.device)
    args = (q, k_cache, v_cache, block_tables, qs_t, ctx_t, out,
            float(scale) * 1.4426950408889634, min(next_pow2(max(1, max_new)), 4096),
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1))
    consts = dict(GROUP=group, GROUP_P=group_p, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_SIZE=bs,
                  UPCAST=interp, IEEE=q.dtype == torch.float32)
    if interp or block_m is not None or block_n is not None:
        # fixed tiles: the Q tile keeps >= 16 rows (tokens x padded group) for tl.dot
        bm = block_m or max(1, 16 // group_p)
        bn = block_n or 16
        if bn < 16 or bn & (bn - 1) or bm < 1 or bm & (bm - 1) or bm * group_p < 16:
            raise ValueError(f"block_m ({bm}) x padded group ({group_p}) must be >= 16 and "
                             f"block_n ({bn}) a power of two >= 16 (tl.dot tiles on GPUs)")
        grid = (num_seqs, triton.cdiv(max_new, bm), hkv)
        _prefill_kernel[grid](*args, **consts, BLOCK_M=bm, BLOCK_N=bn, num_warps=4)
    else:
        def grid(meta):
            return (num_seqs, triton.cdiv(max_new, meta["BLOCK_M"]), hkv)
        _prefill_tuned[grid](*args, **consts)
    return out
