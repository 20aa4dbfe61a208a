"""What one forward pass needs to find K/V in the paged cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor     # [T] flat slot where each computed token's K/V is stored
    block_tables: torch.Tensor     # [S, max_blocks] physical block ids (padding: 0)
    context_lens: torch.Tensor     # [S] tokens in the cache after this step's writes
    query_start: list[int]         # prefill: sequence i's new tokens are rows [qs[i], qs[i+1])
    context_lens_list: list[int]   # the same as context_lens, on the host
    max_context_len: int = 0       # max(context_lens_list), computed once per forward


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, ops, scale: float) -> torch.Tensor:
    """Store this step's K/V into their slots, then attend through the block tables.

    The whole batch's K/V is stored before anyone attends: a sequence whose prefix blocks are
    shared with a sibling prefilled in the same step (or a same-step prefix-cache hit) reads
    K/V that the sibling's tokens wrote a moment ago."""
    ops.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    if meta.is_prefill:
        return ops.paged_prefill_attention(q, k_cache, v_cache, meta.block_tables,
                                           meta.query_start, meta.context_lens_list, scale)
    return ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens,
                                      scale, meta.max_context_len)
