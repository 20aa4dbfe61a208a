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
