"""What vLLM v0's block manager and v1's KV cache manager share: the device pool, the prefix
cache's hashes and lookups, allocation and freeing. Each engine's manager adds only what it has
(v0: fork, copy-on-write, swap; v1: slots for a token budget, the null block).

Rules (docs/architecture.md#memory-rules):
- A sequence with ``num_computed`` cached tokens holds ceil(num_computed / block_size) blocks.
- Freeing releases blocks in reverse table order (``BlockPool.free_blocks``), so a sequence's
  tail blocks are reused or evicted before the prefix blocks others are likelier to share.
- A table records the pool it points into (``seq.block_device``), set whenever a table is
  built, copied, moved or cleared. ``pool_of`` reads only that, never the status: the scheduler
  changes statuses, and a status set a line too early must not make a free decref the other
  pool's blocks.
- Block hashes are ``hashing.hash_block``'s, chained from the first block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import engine.events as ev
from engine.core.block_math import slot_of
from engine.core.block_pool import BlockPool
from engine.core.hashing import NO_PARENT, block_extra_keys, hash_block
from engine.core.sequence import Sequence


@dataclass(frozen=True)
class PrefixCacheStats:
    """vLLM's prefix-cache metrics, in tokens: prompt tokens looked up and found cached; v1
    also counts lookups by requests preempted before apart (``preempted_*``)."""
    queries: int
    hits: int
    preempted_queries: int = 0
    preempted_hits: int = 0


class KVCacheBase:
    def __init__(self, gpu: BlockPool, enable_prefix_caching: bool,
                 emit: Callable[[ev.Event], None]):
        self.block_size = gpu.block_size
        self.gpu = gpu
        self.caching = enable_prefix_caching
        self.emit = emit
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def pools(self) -> dict[str, BlockPool]:
        """Every pool a block table may point into, by ``seq.block_device``."""
        return {"gpu": self.gpu}

    def pool_of(self, seq: Sequence) -> BlockPool:
        """The pool ``seq``'s block table points into: the one stored with the table."""
        return self.pools[seq.block_device]

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.prefix_cache_queries, self.prefix_cache_hits)

    def unscheduled_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies not yet handed to a batch (none without copy-on-write)."""
        return []

    # ---- prefix hashes -------------------------------------------------------------------
    @staticmethod
    def _parent_hash(seq: Sequence, logical: int) -> str:
        return seq.block_hashes[logical - 1] if logical else NO_PARENT

    def _update_hashes(self, seq: Sequence) -> None:
        bs = self.block_size
        while len(seq.block_hashes) < len(seq.token_ids) // bs:
            i = len(seq.block_hashes)
            seq.block_hashes.append(hash_block(self._parent_hash(seq, i),
                                               seq.token_ids[i * bs:(i + 1) * bs],
                                               block_extra_keys(seq.cache_salt, i)))

    def _register(self, seq: Sequence, b: int, logical: int, pool: BlockPool | None = None) -> None:
        """Offer ``seq``'s full ``logical``-th block (physical ``b``) to the prefix cache; a
        block that entered it is announced (``Cached``, vLLM's ``BlockStored``)."""
        pool = pool or self.gpu
        h, parent = seq.block_hashes[logical], self._parent_hash(seq, logical)
        if pool.register(b, h, parent, block_extra_keys(seq.cache_salt, logical)):
            self.emit(ev.Cached(seq.seq_id, b, h, parent, tuple(pool.tokens[b])))

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset_prefix_cache: only when no block is in use; emits ``CacheReset``."""
        if not self.gpu.reset_cache():
            return False
        self.emit(ev.CacheReset())
        return True

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks matching the prompt's leading full blocks. At least one token is left
        to compute, since the last position's logits are needed to sample."""
        if not self.caching:
            return []
        self._update_hashes(seq)
        hits = []
        for h in seq.block_hashes[:(seq.num_tokens - 1) // self.block_size]:
            b = self.gpu.lookup(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def _count_query(self, seq: Sequence, hit_blocks: int) -> None:
        if self.caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += hit_blocks * self.block_size

    # ---- allocate / free -----------------------------------------------------------------
    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat slots of tokens [start, end) (where the forward pass stores their K/V)."""
        return [slot_of(seq.block_table, p, self.block_size) for p in range(start, end)]

    def _allocate(self, seq: Sequence, logical: int) -> int:
        b, evicted = self.gpu.allocate()
        if evicted is not None:
            self.emit(ev.Evict(b, evicted))
        self.emit(ev.Alloc(seq.seq_id, logical, b))
        if logical == len(seq.block_table):
            seq.block_table.append(b)
        else:
            seq.block_table[logical] = b
        return b

    def free(self, seq: Sequence) -> None:
        pool = self.pool_of(seq)
        for b in pool.free_blocks(reversed(seq.block_table)):     # last block first (vLLM)
            self.emit(ev.Free(b, pool.block_hash[b] is not None, pool.device))
        seq.block_table = []
        seq.block_device = "gpu"        # an empty table; the next one is built on the GPU
        seq.num_computed = 0
