"""Runs one scheduled batch through the model on the paged KV cache.

Order inside a step: swap-out copies, swap-in copies, CoW ``copy_blocks`` (one batched op),
then the forward pass, which stores each computed token's K/V into its slot and attends
through the block tables.
"""
from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.models.attention_metadata import AttentionMetadata
from engine.models.device import resolve_device, resolve_dtype
from engine.models.loader import LoadedModel, load_model
from engine.sched.interface import ScheduledBatch
from paged_kernels import get_ops, resolve_backend


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_gpu_blocks: int, num_cpu_blocks: int,
                 block_size: int, device: str, dtype: torch.dtype, ops, backend: str = ""):
        self.loaded = loaded
        self.model = loaded.model
        self.spec = loaded.spec
        self.device = device
        self.dtype = dtype
        self.ops = ops
        self.backend = backend or ops.name
        s = loaded.spec
        shape = (s.num_layers, 2, num_gpu_blocks, block_size, s.num_kv_heads, s.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.cpu_kv_cache = torch.zeros((*shape[:2], num_cpu_blocks, *shape[3:]), dtype=dtype,
                                        device="cpu", pin_memory=device.startswith("cuda"))
        self.block_size = block_size

    @classmethod
    def from_config(cls, config: EngineConfig) -> "ModelRunner":
        """Device (auto: CUDA if present), dtype (auto: bf16 on CUDA, fp32 on CPU), kernels
        (auto: Triton on CUDA, guarded by the per-op fallback), weights (loaded once per
        process), and the KV pools."""
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        backend = resolve_backend(config.backend, device)
        loaded = load_model(config.model, device, dtype)
        return cls(loaded, config.num_gpu_blocks, config.num_cpu_blocks, config.block_size,
                   device, dtype, get_ops(backend, fallback=config.kernel_fallback), backend)

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

    def move_kv(self, batch: ScheduledBatch) -> None:
        """The batch's KV moves alone: swap-out, swap-in, copy-on-write copies (a step that
        computes nothing can still swap a preempted group out)."""
        if self.device.startswith("cuda"):
            with torch.cuda.device(self.device):
                return self._move_kv(batch)
        return self._move_kv(batch)

    @torch.inference_mode()
    def _move_kv(self, batch: ScheduledBatch) -> None:
        if batch.swap_out:
            src, dst = zip(*batch.swap_out)
            self.ops.swap_blocks(self.kv_cache, self.cpu_kv_cache, self._ids(src), self._ids(dst))
        if batch.swap_in:
            src, dst = zip(*batch.swap_in)
            self.ops.swap_blocks(self.cpu_kv_cache, self.kv_cache, self._ids(src), self._ids(dst))
        if batch.copies:
            src, dst = zip(*batch.copies)
            self.ops.copy_blocks(self.kv_cache, self._ids(src), self._ids(dst))

    @torch.inference_mode()
    def _execute(self, batch: ScheduledBatch) -> torch.Tensor:
        self._move_kv(batch)

        seqs = batch.seqs
        prefill = batch.is_prefill
        tokens, positions, query_start = [], [], [0]
        for r in batch.scheduled:                       # each sequence's tokens [start, end)
            tokens += r.seq.token_ids[r.start:r.end]
            positions += range(r.start, r.end)
            query_start.append(len(tokens))
        last_rows = [q - 1 for q in query_start[1:]]
        max_blocks = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs]
        ctx = [r.end for r in batch.scheduled]    # the cache holds [0, end) after the write
        meta = AttentionMetadata(
            is_prefill=prefill,
            slot_mapping=self._ids(batch.slot_mapping),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=self.device),
            context_lens=torch.tensor(ctx, dtype=torch.int32, device=self.device),
            query_start=query_start,
            context_lens_list=ctx,
            max_context_len=max(ctx),
        )
        hidden = self.model(self._ids(tokens), self._ids(positions), self.kv_cache, meta, self.ops)
        return self.model.compute_logits(hidden[last_rows]).float()
