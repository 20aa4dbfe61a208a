"""vLLM v1's KV cache manager: slots for a token budget, sharing only through the prefix cache.

Follows vLLM's ``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py`` (facts, not code):
- Block 0 is the null block: never handed out, never freed (``BlockPool(null_block=True)``).
- ``get_computed_blocks``: the longest run of cached full blocks matching the request's
  leading tokens, capped so at least the last token is computed (its logits are sampled).
- ``record_prefix_cache_stats``: the scheduler counts a lookup once the request is admitted
  (current vLLM, "Record at admission so unscheduled lookups are not counted": a waiting head
  refused blocks is looked up again every step). Queries and hits are counted in tokens
  (vLLM's ``prefix_cache_queries`` / ``_hits``); a request preempted before counts in
  ``prefix_cache_preempted_queries`` / ``_hits`` instead.
- ``allocate_slots(seq, num_new, hits)``: blocks for ``num_computed + num_new`` tokens, or
  False (nothing changed) when the free queue cannot supply them -- the scheduler preempts.
  A hit on a cached block that is free takes it out of the free queue; it counts against the
  free blocks like a fresh allocation would. Full blocks are hashed and cached as soon as their
  slots are allocated (their K/V is written in this step's forward pass, before anyone attends).
- ``free``: a request's blocks go back last block first; those with no hash to the front of
  the free queue, cached ones to the back (``BlockPool.free_blocks``), so its prefix, likelier
  shared, is evicted last.
- No fork, no copy-on-write, no swap: a block is shared only as a prefix-cache hit, and only
  full blocks are cached, so nobody ever writes into a shared block.
Hashes, lookups, allocation and freeing are shared with v0's block manager (``kv_cache_base``;
the hash is ``hashing.hash_block``), so one prefix-cache model serves both engines.
"""
from __future__ import annotations

from typing import Callable

import engine.events as ev
from engine.core.block_math import cdiv
from engine.core.block_pool import BlockPool
from engine.core.kv_cache_base import KVCacheBase, PrefixCacheStats
from engine.core.sequence import Sequence


class KVCacheManager(KVCacheBase):
    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool,
                 emit: Callable[[ev.Event], None]):
        if num_gpu_blocks < 2:
            raise ValueError("vLLM v1 needs num_gpu_blocks >= 2: block 0 is the null block")
        super().__init__(BlockPool(num_gpu_blocks, block_size, "gpu", null_block=True,
                                   keep_copies=True), enable_prefix_caching, emit)
        # vLLM's PrefixCacheStats.preempted_queries / _hits: lookups by requests preempted
        # before, kept out of the two counts above
        self.prefix_cache_preempted_queries = 0
        self.prefix_cache_preempted_hits = 0

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.prefix_cache_queries, self.prefix_cache_hits,
                                self.prefix_cache_preempted_queries,
                                self.prefix_cache_preempted_hits)

    # ---- prefix cache --------------------------------------------------------------------
    def get_computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks for the request's leading full blocks (never its last token). Nothing
        is touched or counted: the caller may still fail to allocate."""
        return self._prefix_hits(seq)

    def record_prefix_cache_stats(self, seq: Sequence, hit_blocks: int) -> None:
        """Count an admitted request's lookup (vLLM's ``KVCacheManager.
        record_prefix_cache_stats``, called by ``Scheduler.schedule`` after ``allocate_slots``
        succeeded)."""
        self._count_query(seq, hit_blocks)

    def _count_query(self, seq: Sequence, hit_blocks: int) -> None:
        """As vLLM's ``PrefixCacheStats.record(num_tokens, num_hits, preempted)``
        (vllm/v1/metrics/stats.py; ``preempted = request.num_preemptions > 0``): a request
        preempted before looks up its own blocks again, and counting that would raise the hit
        rate, so its lookups go to the preempted counters instead."""
        if not self.caching:
            return
        if seq.num_preemptions:
            self.prefix_cache_preempted_queries += seq.num_tokens
            self.prefix_cache_preempted_hits += hit_blocks * self.block_size
        else:
            super()._count_query(seq, hit_blocks)

    # ---- slots for this step's tokens ----------------------------------------------------
    def blocks_to_allocate(self, seq: Sequence, num_new: int, hits: list[int]) -> int:
        """Free blocks allocating would consume: new blocks plus free cached hits revived."""
        computed = seq.num_computed + len(hits) * self.block_size
        total = cdiv(computed + num_new, self.block_size)
        new = total - len(seq.block_table) - len(hits)
        return new + sum(1 for b in hits if self.gpu.ref_count[b] == 0)

    def allocate_slots(self, seq: Sequence, num_new: int, hits: list[int] = ()) -> bool:
        """Give ``seq`` slots for ``num_new`` more tokens after its computed ones (and after the
        prefix hits, taken first); False, with nothing changed, if the pool is short."""
        hits = list(hits)
        assert not hits or not seq.block_table, "prefix hits only for a request with no blocks"
        if self.blocks_to_allocate(seq, num_new, hits) > self.gpu.num_free:
            return False
        bs = self.block_size
        seq.block_device = "gpu"
        for b in hits:
            self.gpu.incref(b)            # "touch": a free cached block leaves the free queue
            logical = len(seq.block_table)
            seq.block_table.append(b)
            self.emit(ev.PrefixHit(seq.seq_id, logical, b, seq.block_hashes[logical]))
        seq.num_computed += len(hits) * bs
        start, end = seq.num_computed, seq.num_computed + num_new
        for logical in range(len(seq.block_table), cdiv(end, bs)):
            self._allocate(seq, logical)
        for logical in range(start // bs, cdiv(end, bs)):
            a, b = max(start, logical * bs), min(end, (logical + 1) * bs)
            block = seq.block_table[logical]
            assert self.gpu.ref_count[block] == 1, f"write into shared block {block}"
            assert len(self.gpu.tokens[block]) == a - logical * bs, f"block {block} out of order"
            self.gpu.write(block, seq.token_ids[a:b])
            if self.caching and b == (logical + 1) * bs:
                self._update_hashes(seq)
                self._register(seq, block, logical)
        return True
