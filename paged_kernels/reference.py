"""Torch reference implementations of the paged-KV ops.

Cache layout (per layer): k_cache, v_cache of shape [num_blocks, block_size, num_kv_heads, head_dim].
A token at position p of a sequence lives in physical block ``block_table[p // block_size]``
at slot ``p % block_size``; its flat slot id is ``block * block_size + slot``.

These run on any device and are the ground truth the Triton kernels are tested against.
Attention reads K/V by indexing the cache with the block table (the paged gather); it never
asks the engine for a contiguous copy of a sequence's cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write k, v ([T, kv_heads, head_dim]) into the flat slots ``slot_mapping`` ([T])."""
    nb, bs, h, d = k_cache.shape
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy whole blocks src[i] -> dst[i] in every layer, K and V, in one batched op.

    kv_cache: [num_layers, 2, num_blocks, block_size, kv_heads, head_dim].
    """
    if src.numel():
        kv_cache[:, :, dst] = kv_cache[:, :, src]


def swap_blocks(src_cache: torch.Tensor, dst_cache: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor) -> None:
    """Move blocks between two pools (e.g. device <-> CPU swap space), all layers at once."""
    if src.numel():
        dst_cache[:, :, dst.to(dst_cache.device)] = src_cache[:, :, src.to(src_cache.device)].to(
            dst_cache.device)


def _gather_paged(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """K or V of one sequence, [length, kv_heads, head_dim], read through its block table."""
    bs = cache.shape[1]
    nblocks = (length + bs - 1) // bs
    return cache[block_table[:nblocks]].flatten(0, 1)[:length]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float, max_context: int | None = None) -> torch.Tensor:
    """One query token per sequence attends to its whole paged context.

    q: [S, q_heads, D]; block_tables: [S, max_blocks] (padding entries ignored);
    context_lens: [S] (tokens in the cache, the query token's own K/V included);
    max_context: max(context_lens) when the caller knows it on the host (saves a sync).
    Returns [S, q_heads, D]. The batch's K/V is gathered through the block tables, then one
    fp32 ``scaled_dot_product_attention`` with a length mask does the math (measured ~25%
    faster on CPU than two einsums and a masked softmax).
    """
    s, hq, d = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    max_len = int(max_context) if max_context is not None else int(context_lens.max())
    nblocks = (max_len + bs - 1) // bs
    # Batched paged gather: [S, nblocks, bs, hkv, D] -> [S, hkv, L, D]
    idx = block_tables[:, :nblocks]
    k = k_cache[idx].flatten(1, 2)[:, :max_len].transpose(1, 2).float()
    v = v_cache[idx].flatten(1, 2)[:, :max_len].transpose(1, 2).float()
    visible = torch.arange(max_len, device=q.device)[None, :] < context_lens[:, None]   # [S, L]
    out = _sdpa_gqa(q.float()[:, :, None, :], k, v, visible[:, None, None, :], scale)
    return out[:, :, 0].to(q.dtype)


_HAS_ENABLE_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # torch 2.5 added it


def _sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """SDPA where each KV head serves q_heads / kv_heads query heads (torch < 2.5 has no
    enable_gqa: expand K/V instead, the same result)."""
    if _HAS_ENABLE_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                          v.repeat_interleave(group, 1), attn_mask=mask,
                                          scale=scale)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start: list[int],
                            context_lens: list[int], scale: float) -> torch.Tensor:
    """New tokens attend causally to the cached context plus themselves, through the block table.

    q: [T, q_heads, D], the new tokens of all sequences packed; sequence i owns rows
    query_start[i]:query_start[i+1] and they are the *last* tokens of its context_lens[i]
    tokens (their K/V were already stored). Earlier tokens (a prefix-cache hit, or nothing)
    are read from the cache too. Returns [T, q_heads, D].
    """
    hq, d = q.shape[1], q.shape[2]
    hkv = k_cache.shape[2]
    group = hq // hkv
    out = torch.empty_like(q)
    for i, ctx in enumerate(context_lens):
        a, b = query_start[i], query_start[i + 1]
        n = b - a
        k = _gather_paged(k_cache, block_tables[i], ctx).float()
        v = _gather_paged(v_cache, block_tables[i], ctx).float()
        qs = q[a:b].float().view(n, hkv, group, d)
        scores = torch.einsum("nhgd,lhd->hgnl", qs, k) * scale
        q_pos = torch.arange(ctx - n, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        causal = k_pos[None, :] > q_pos[:, None]            # [n, L]
        scores = scores.masked_fill(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("hgnl,lhd->nhgd", probs, v)
        out[a:b] = o.reshape(n, hq, d).to(q.dtype)
    return out
