"""Runs one scheduled batch through the model on the paged KV cache.

Order inside a step: swap-out copies, swap-in copies, CoW ``copy_blocks`` (one batched op),
then the forward pass, which stores each computed token's K/V into its slot and attends
through the block tables.
"""
from __future__ import annotations

import torch

from engine.attention_metadata import AttentionMetadata
from engine.models.loader import LoadedModel
from engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_gpu_blocks: int, num_cpu_blocks: int,
                 block_size: int, device: str, dtype: torch.dtype, ops):
        self.model = loaded.model
        self.spec = loaded.spec
        self.device = device
        self.ops = ops
        s = loaded.spec
        shape = (s.num_layers, 2, num_gpu_blocks, block_size, s.num_kv_heads, s.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.cpu_kv_cache = torch.zeros((*shape[:2], num_cpu_blocks, *shape[3:]), dtype=dtype,
                                        device="cpu", pin_memory=device.startswith("cuda"))
        self.block_size = block_size

    @property
    def bytes_per_block(self) -> int:
        per_block = self.kv_cache[:, :, 0].numel() if self.kv_cache.shape[2] else 0
        return per_block * self.kv_cache.element_size()

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def execute(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits (float32, [num_seqs, vocab]) at each scheduled sequence's last position."""
        if self.device.startswith("cuda"):
            with torch.cuda.device(self.device):     # Triton launches on the current device
                return self._execute(batch)
        return self._execute(batch)

    @torch.inference_mode()
    def _execute(self, batch: ScheduledBatch) -> torch.Tensor:
        if batch.swap_out:
            src, dst = zip(*batch.swap_out)
            self.ops.swap_blocks(self.kv_cache, self.cpu_kv_cache, self._ids(src), self._ids(dst))
        if batch.swap_in:
            src, dst = zip(*batch.swap_in)
            self.ops.swap_blocks(self.cpu_kv_cache, self.kv_cache, self._ids(src), self._ids(dst))
        if batch.copies:
            src, dst = zip(*batch.copies)
            self.ops.copy_blocks(self.kv_cache, self._ids(src), self._ids(dst))

        seqs = batch.seqs
        prefill = batch.kind == "prefill"
        if prefill:
            tokens, positions, query_start = [], [], [0]
            for s, start in zip(seqs, batch.starts):
                tokens += s.token_ids[start:]
                positions += range(start, s.num_tokens)
                query_start.append(len(tokens))
            last_rows = [q - 1 for q in query_start[1:]]
        else:
            tokens = [s.token_ids[-1] for s in seqs]
            positions = [s.num_tokens - 1 for s in seqs]
            query_start = list(range(len(seqs) + 1))
            last_rows = list(range(len(seqs)))
        max_blocks = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs]
        ctx = [s.num_tokens for s in seqs]
        meta = AttentionMetadata(
            is_prefill=prefill,
            slot_mapping=self._ids(batch.slot_mapping),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),
            context_lens=torch.tensor(ctx, dtype=torch.int32, device=self.device),
            query_start=query_start,
            context_lens_list=ctx,
        )
        hidden = self.model(self._ids(tokens), self._ids(positions), self.kv_cache, meta, self.ops)
        return self.model.compute_logits(hidden[last_rows]).float()
