"""vLLM v0's block manager: block tables with fork, copy-on-write and swap, on top of the
shared pool and prefix cache (``kv_cache_base``).

This is where v0's memory events are born. Rules (docs/architecture.md#memory-rules):
- Fork copies the table and increments refcounts; no K/V moves.
- Copy-on-write: before writing into a block with ref_count > 1 the writer gets a fresh block,
  the K/V bytes are copied (``pending_copies``, run by the model runner as one batched
  ``copy_blocks`` before the forward pass) and the shared block loses one reference.
  The last sharer (ref_count == 1) writes in place. Full blocks are never written again.
- Swap moves a group's blocks to the CPU pool and back, keeping the sharing between its
  sequences.
"""
from __future__ import annotations

from typing import Callable

import engine.events as ev
from engine.core.block_math import cdiv, slot_of
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_base import KVCacheBase
from engine.core.sequence import Sequence, SeqStatus


class BlockManager(KVCacheBase):
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 enable_prefix_caching: bool, emit: Callable[[ev.Event], None]):
        super().__init__(BlockPool(num_gpu_blocks, block_size, "gpu"), enable_prefix_caching,
                         emit)
        self.cpu = BlockPool(num_cpu_blocks, block_size, "cpu")
        self.pending_copies: list[tuple[int, int]] = []   # CoW (src, dst) for this step

    @property
    def pools(self) -> dict[str, BlockPool]:
        return {"gpu": self.gpu, "cpu": self.cpu}

    def unscheduled_copies(self) -> list[tuple[int, int]]:
        return self.pending_copies

    # ---- prefill -----------------------------------------------------------------------
    def _shared_prefix(self, first: Sequence | None, seq: Sequence) -> int:
        """Leading full blocks ``seq`` can share with ``first``, a sibling prefilled in the same
        step (a recomputed n > 1 or beam group): equal tokens, so equal K/V. Without this a
        recomputed group would need more blocks than it ever held and might never fit again."""
        if first is None:
            return 0
        bs = self.block_size
        limit = min(first.num_tokens, seq.num_tokens - 1) // bs   # leave >= 1 token to compute
        n = 0
        while n < limit and seq.token_ids[n * bs:(n + 1) * bs] == first.token_ids[n * bs:(n + 1) * bs]:
            n += 1
        return n

    def _prefill_reuse(self, seq: Sequence, share_with: Sequence | None) -> tuple[int, list[int]]:
        """What a prefill reuses: leading blocks shared with ``share_with``, else (0, the
        prefix-cache hits)."""
        shared = self._shared_prefix(share_with, seq)
        return (shared, []) if shared else (0, self._prefix_hits(seq))

    def prefill_need(self, seq: Sequence, share_with: Sequence | None = None) -> tuple[int, int]:
        """(free blocks, tokens) a prefill would take: the blocks it does not reuse (reviving a
        cached free block takes one too), and the tokens it computes, i.e. ``num_tokens`` minus
        what ``allocate_for_prefill`` will return."""
        shared, hits = self._prefill_reuse(seq, share_with)
        reused = shared + len(hits)
        blocks = (cdiv(seq.num_tokens, self.block_size) - reused
                  + sum(1 for b in hits if self.gpu.ref_count[b] == 0))
        return blocks, seq.num_tokens - reused * self.block_size

    def allocate_for_prefill(self, seq: Sequence, share_with: Sequence | None = None) -> int:
        """Give a waiting sequence blocks for all its tokens; returns the tokens already cached.

        Blocks shared with ``share_with`` (or found in the prefix cache) are not recomputed:
        their K/V is stored by the sibling's prefill in the same forward pass, and every layer
        stores the whole batch's K/V before it attends."""
        assert not seq.block_table, f"seq {seq.seq_id} already holds blocks"
        bs = self.block_size
        seq.block_device = "gpu"
        shared, hits = self._prefill_reuse(seq, share_with)
        if shared:
            for b in share_with.block_table[:shared]:
                self.gpu.incref(b)
                seq.block_table.append(b)
            self.emit(ev.Fork(share_with.seq_id, seq.seq_id, tuple(seq.block_table)))
            if self.caching:
                self._update_hashes(seq)
        else:
            self._count_query(seq, len(hits))
            for i, b in enumerate(hits):
                self.gpu.incref(b)
                seq.block_table.append(b)
                self.emit(ev.PrefixHit(seq.seq_id, i, b, seq.block_hashes[i]))
        reused = len(seq.block_table)
        for i in range(reused, cdiv(seq.num_tokens, bs)):
            b = self._allocate(seq, i)
            self.gpu.write(b, seq.token_ids[i * bs:(i + 1) * bs])
            if self.caching and len(self.gpu.tokens[b]) == bs:
                self._register(seq, b, i)
        seq.num_computed = reused * bs
        return seq.num_computed

    # ---- decode ------------------------------------------------------------------------
    def blocks_needed_for_append(self, seqs: list[Sequence]) -> int:
        """Exact number of fresh blocks one decode step of these sequences needs: a new block
        at a block boundary, a CoW copy for each writer of a shared block except the last.
        (Swapped sequences are counted as they will be once swapped back in.)"""
        need = 0
        writers: dict[int, int] = {}
        for s in seqs:
            if s.num_computed % self.block_size == 0:
                need += 1
            else:
                b = s.block_table[-1]
                writers[b] = writers.get(b, 0) + 1
        pool = self.pool_of(seqs[0]) if seqs else self.gpu
        for b, n in writers.items():
            refs = pool.ref_count[b]
            if refs == n:        # only these writers share it: the last one writes in place
                need += n - 1
            elif refs > 1:       # shared with others too: every writer copies
                need += n
        return need

    def append_slot(self, seq: Sequence) -> int:
        """Reserve the slot for the sequence's newest token (CoW if needed); returns flat slot."""
        assert seq.block_device == "gpu", f"seq {seq.seq_id} appends while its blocks are on the cpu"
        bs = self.block_size
        pos = seq.num_computed
        logical, offset = divmod(pos, bs)
        if offset == 0:
            b = self._allocate(seq, logical)
        else:
            b = seq.block_table[logical]
            if self.gpu.ref_count[b] > 1:
                src = b
                b = self._allocate(seq, logical)
                self.gpu.write(b, self.gpu.tokens[src])
                self.pending_copies.append((src, b))
                self.gpu.decref(src)              # cannot reach 0: another sharer remains
                self.emit(ev.Cow(seq.seq_id, logical, src, b))
        # the invariant "no shared block is written", and slots fill in order
        assert self.gpu.ref_count[b] == 1, f"write into shared block {b}"
        assert len(self.gpu.tokens[b]) == offset, f"block {b} slot {offset} out of order"
        token = seq.token_ids[pos]
        self.gpu.write(b, [token])
        slot = slot_of(seq.block_table, pos, bs)       # b is the table's entry by now
        self.emit(ev.Append(seq.seq_id, token, logical, b, slot))
        if self.caching and offset == bs - 1:
            self._update_hashes(seq)
            self._register(seq, b, logical)
        return slot

    # ---- fork / free ---------------------------------------------------------------------
    def fork(self, parent: Sequence, child: Sequence) -> None:
        pool = self.pool_of(parent)
        child.block_table = list(parent.block_table)
        child.block_device = parent.block_device
        for b in child.block_table:
            pool.incref(b)
        child.num_computed = parent.num_computed
        child.block_hashes = list(parent.block_hashes)
        self.emit(ev.Fork(parent.seq_id, child.seq_id, tuple(child.block_table)))

    # ---- swap --------------------------------------------------------------------------
    @staticmethod
    def _unique_blocks(seqs: list[Sequence]) -> set[int]:
        return {b for s in seqs for b in s.block_table}

    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        return len(self._unique_blocks(seqs)) <= self.cpu.num_free

    def blocks_needed_for_swap_in(self, seqs: list[Sequence]) -> int:
        return len(self._unique_blocks(seqs))

    def _move(self, seqs: list[Sequence], src: BlockPool, dst: BlockPool,
              event: type, status: SeqStatus) -> list[tuple[int, int]]:
        """Copy the group's blocks to the other pool, keeping sharing between its sequences."""
        mapping: dict[int, int] = {}
        for seq in seqs:
            table = []
            for b in seq.block_table:
                if b in mapping:
                    dst.incref(mapping[b])
                else:
                    nb, evicted = dst.allocate()
                    if evicted is not None:
                        self.emit(ev.Evict(nb, evicted))
                    dst.write(nb, src.tokens[b])
                    mapping[b] = nb
                table.append(mapping[b])
            self.emit(event(seq.seq_id, tuple((b, mapping[b]) for b in seq.block_table)))
            for b in src.free_blocks(reversed(seq.block_table)):
                self.emit(ev.Free(b, src.block_hash[b] is not None, src.device))
            seq.block_table = table
            seq.block_device = dst.device
            seq.status = status
        if self.caching and dst is self.gpu:
            for seq in seqs:
                for i, h in enumerate(seq.block_hashes[:len(seq.block_table)]):
                    if len(dst.tokens[seq.block_table[i]]) == self.block_size:
                        self._register(seq, seq.block_table[i], i, dst)
        return list(mapping.items())

    def swap_out(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        return self._move(seqs, self.gpu, self.cpu, ev.SwapOut, SeqStatus.SWAPPED)

    def swap_in(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        return self._move(seqs, self.cpu, self.gpu, ev.SwapIn, SeqStatus.RUNNING)
