"""The physical block pool: refcounts, the free queue and the prefix cache's hash map.

Invariants (kept by every method here, checked by ``Engine.check_invariants``):
- ``ref_count[b]`` is the number of block-table entries pointing at ``b``.
- ``b`` is in ``free_queue`` iff ``ref_count[b] == 0``; so free + used == total.
- ``tokens[b]`` are the token ids whose K/V block ``b`` holds, in slot order (len = filled slots).
- ``version[b]`` changes whenever anything about ``b`` changes (refcount, tokens, hash), so a
  snapshot can reuse the picture of an unchanged block; token writes go through ``write``.
- ``block_hash[b] == h`` iff ``cached[h] == b`` or ``b in copies[h]``; only full blocks are
  hashed. ``cached[h]`` is the block a lookup finds; ``copies[h]`` (v1 only, in the order they
  were cached) are other blocks holding the same tokens: vLLM v1 does not de-duplicate
  (``BlockHashToBlockMap``: a recomputed block whose hash is cached is cached too), and when
  ``cached[h]`` is evicted the oldest copy takes its place. Without ``keep_copies`` (v0) the
  first block with a hash wins and a copy stays unhashed. A cached block whose refcount drops
  to 0 stays in the map (and keeps its tokens) until it is reallocated.
- Blocks are handed out from the front of the free queue. A freed block with no hash goes to
  the front (reused first: it holds nothing anyone can hit), a freed cached block to the back
  (evicted last, least recently released first): vLLM's ``BlockPool.free_blocks``.
- A hashed block remembers the hash it was chained from and the extra keys (cache salt) that
  went into it: ``block_hash[b] == hash_block(parent_hash[b], tokens[b], extra_keys[b])``
  (``hashing.py``). The predecessor block may be evicted while ``b`` stays cached, so this is
  what lets the prefix cache be checked sound at any time.
- With ``null_block`` (vLLM v1), block 0 is the null block: never handed out, never freed, in
  no table and not on the free queue; so free + used == total - 1 (vLLM v1 block_pool.py).
"""
from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, device: str, null_block: bool = False,
                 keep_copies: bool = False):
        self.num_blocks = num_blocks
        self.null_block = 0 if null_block else None
        self.block_size = block_size
        self.device = device
        self.ref_count = [0] * num_blocks
        self.tokens: list[list[int]] = [[] for _ in range(num_blocks)]
        self.block_hash: list[str | None] = [None] * num_blocks    # full sha256 hex digest
        self.parent_hash: list[str | None] = [None] * num_blocks   # "" for a first block
        self.extra_keys: list[tuple | None] = [None] * num_blocks
        self.version = [0] * num_blocks
        self.cached: dict[str, int] = {}
        self.keep_copies = keep_copies
        self.copies: dict[str, list[int]] = {}
        # allocate from the front; freed blocks go to the front or the back (free_blocks)
        self.free_queue: OrderedDict[int, None] = OrderedDict(
            (b, None) for b in range(num_blocks) if b != self.null_block)

    @property
    def num_usable(self) -> int:
        """Blocks that can ever be handed out (all but the null block)."""
        return self.num_blocks - (self.null_block is not None)

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def allocate(self) -> tuple[int, str | None]:
        """Take the least recently freed block; returns (block, evicted hash or None)."""
        if not self.free_queue:
            raise RuntimeError(f"{self.device} block pool is exhausted")
        b, _ = self.free_queue.popitem(last=False)
        self.version[b] += 1
        evicted = self.block_hash[b]
        if evicted is not None:
            self._uncache(b, evicted)
            self.block_hash[b] = None
            self.parent_hash[b] = None
            self.extra_keys[b] = None
        self.tokens[b] = []
        self.ref_count[b] = 1
        return b, evicted

    def _uncache(self, b: int, h: str) -> None:
        others = self.copies.pop(h, [])
        if self.cached[h] == b:
            if others:
                self.cached[h] = others.pop(0)        # the oldest copy is found from now on
            else:
                del self.cached[h]
        else:
            others.remove(b)
        if others:
            self.copies[h] = others

    def hashed_blocks(self) -> list[int]:
        """Every block in the prefix cache: the ones lookups find, then their copies."""
        return list(self.cached.values()) + [b for bs in self.copies.values() for b in bs]

    def incref(self, b: int) -> None:
        self.version[b] += 1
        if self.ref_count[b] == 0:          # reviving a cached free block
            del self.free_queue[b]
        self.ref_count[b] += 1

    def decref(self, b: int) -> bool:
        """Drop one reference; True when the block became free."""
        return bool(self.free_blocks((b,)))

    def free_blocks(self, ordered) -> list[int]:
        """Drop one reference from each block of ``ordered``; returns those that became free,
        in that order. As vLLM's ``BlockPool.free_blocks`` (vllm/v1/core/block_pool.py): the
        freed blocks with no hash go to the front of the free queue in this order (the first
        is reused first), the freed cached ones to the back in this order (vLLM PR #42656;
        with prefix caching off no block has a hash, so all go to the front, the order PR
        #51482 restored). A sequence frees its table last block first, so its last block is
        the first reused or evicted and its prefix, likelier shared, the last. vLLM v0's
        allocators did the same (a freed block id back at the front of NaiveBlockAllocator's
        deque; cached blocks to the evictor, used only once no uncached block is free)."""
        freed = []
        for b in ordered:
            assert self.ref_count[b] > 0, f"block {b} freed twice"
            self.version[b] += 1
            self.ref_count[b] -= 1
            if not self.ref_count[b]:
                freed.append(b)
        for b in reversed(freed):
            if self.block_hash[b] is None:
                self.tokens[b] = []
                self.free_queue[b] = None
                self.free_queue.move_to_end(b, last=False)
        for b in freed:
            if self.block_hash[b] is not None:
                self.free_queue[b] = None
        return freed

    def register(self, b: int, block_hash: str, parent_hash: str,
                 extra_keys: tuple | None = None) -> bool:
        """Offer a full block to the prefix cache; True when ``b`` entered it (a second block
        with the same hash enters only as a copy, with ``keep_copies``). ``block_hash`` is
        chained from ``parent_hash``, the previous block's hash ("" if none), over the block's
        tokens and ``extra_keys``."""
        if self.block_hash[b] is not None:
            return False
        if block_hash in self.cached:
            if not self.keep_copies:
                return False
            self.copies.setdefault(block_hash, []).append(b)
        else:
            self.cached[block_hash] = b
        self.version[b] += 1
        self.block_hash[b] = block_hash
        self.parent_hash[b] = parent_hash
        self.extra_keys[b] = extra_keys
        return True

    def reset_cache(self) -> bool:
        """Drop every prefix-cache entry, as vLLM's ``reset_prefix_cache``: only when no block
        is in use (a running request's hashes must stay valid); False (nothing done) otherwise."""
        if self.num_free != self.num_usable:
            return False
        for b in self.hashed_blocks():
            self.version[b] += 1
            self.block_hash[b] = self.parent_hash[b] = self.extra_keys[b] = None
            self.tokens[b] = []
        self.cached.clear()
        self.copies.clear()
        return True

    def write(self, b: int, token_ids: list[int]) -> None:
        """Record the tokens whose K/V this step stores into ``b`` (appended in slot order)."""
        self.version[b] += 1
        self.tokens[b].extend(token_ids)

    def lookup(self, block_hash: str) -> int | None:
        return self.cached.get(block_hash)
