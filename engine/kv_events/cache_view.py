"""The prefix cache as a KV event stream describes it (no sockets): the Watch view's model.

Pure: feed it ``ReceivedBatch``es (from ``subscriber.py``, or decoded from a file) and read what
is cached now, how often each hash was stored, what was removed, and per-batch counts.
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Iterable

from engine.kv_events.subscriber import ReceivedBatch
from engine.kv_events.wire import (AllBlocksCleared, BlockRemoved, BlockStored,
                                   ExternalBlockHash, hash_hex)

@dataclass(frozen=True)
class CachedBlock:
    """A block in the prefix cache as a KV event stream describes it."""
    block_hash: ExternalBlockHash
    parent_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...] | None   # None when the event carried no (or too few) tokens
    block_size: int
    rank: int
    medium: str | None
    group: int
    seq: int                            # the batch that stored it
    ts: float
    stores: int                         # times this hash was stored so far (this one included)

    @property
    def key(self) -> tuple:
        return (self.rank, self.group, self.medium, self.block_hash)

    @property
    def parent_key(self) -> tuple | None:
        if self.parent_hash is None:
            return None
        return (self.rank, self.group, self.medium, self.parent_hash)


def split_tokens(token_ids, n_blocks: int, block_size: int) -> list[tuple[int, ...] | None]:
    """A multi-block BlockStored's tokens, one tuple per block (None where they run short)."""
    out = []
    for i in range(n_blocks):
        chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
        out.append(chunk if len(chunk) == block_size else None)
    return out


class PrefixCacheView:
    """The prefix cache rebuilt from KV event batches: what is cached now, how often each hash
    was stored, what was removed, and per-batch counts over time. Pure: feed it batches."""

    def __init__(self, max_points: int = 20_000, max_log: int = 500, max_removed: int = 1000):
        self.blocks: dict[tuple, CachedBlock] = {}
        # live copies per hash: vLLM v1 caches a recomputed block whose hash is cached already
        # (a BlockStored for each copy) and removes them one by one (a BlockRemoved each), so a
        # hash stays cached until its last copy is removed
        self.copies: Counter = Counter()
        self.cached_per_rank: Counter = Counter()
        self.store_counts: Counter = Counter()
        self.removed: deque[CachedBlock] = deque(maxlen=max_removed)
        self.series: deque[dict] = deque(maxlen=max_points)
        self.log: deque[dict] = deque(maxlen=max_log)
        self.batches = 0
        self.stored_total = self.removed_total = self.cleared_total = 0
        self.unknown_removed = 0       # removals of hashes stored before we joined

    def apply_all(self, batches: Iterable[ReceivedBatch]) -> None:
        for b in batches:
            self.apply(b)

    def apply(self, batch: ReceivedBatch) -> None:
        rank = batch.data_parallel_rank
        if batch.restart:
            self._clear(rank)
        stored = removed = cleared = 0
        for e in batch.events:
            if isinstance(e, BlockStored):
                stored += self._store(e, batch)
            elif isinstance(e, BlockRemoved):
                removed += self._remove(e, batch)
            elif isinstance(e, AllBlocksCleared):
                cleared += 1
                self.cleared_total += 1
                self._clear(rank)
                self._log(batch, "AllBlocksCleared", 0, None, None, None, None)
        self.batches += 1
        self.series.append({"seq": batch.seq, "ts": batch.ts, "rank": rank, "stored": stored,
                            "removed": removed, "cleared": cleared,
                            "cached": self.cached_per_rank[rank]})

    def _store(self, e: BlockStored, batch: ReceivedBatch) -> int:
        group = e.group_idx or 0
        tokens = split_tokens(e.token_ids, len(e.block_hashes), e.block_size)
        parent = e.parent_block_hash
        for h, toks in zip(e.block_hashes, tokens):
            key = (batch.data_parallel_rank, group, e.medium, h)
            self.store_counts[key] += 1
            self.copies[key] += 1
            self.cached_per_rank[key[0]] += key not in self.blocks
            self.blocks[key] = CachedBlock(h, parent, toks, e.block_size, batch.data_parallel_rank,
                                           e.medium, group, batch.seq, batch.ts,
                                           self.store_counts[key])
            parent = h
        self.stored_total += len(e.block_hashes)
        self._log(batch, "BlockStored", len(e.block_hashes), e.block_hashes[0] if e.block_hashes
                  else None, e.parent_block_hash, e.token_ids, e.medium)
        return len(e.block_hashes)

    def _remove(self, e: BlockRemoved, batch: ReceivedBatch) -> int:
        group = e.group_idx or 0
        for h in e.block_hashes:
            key = (batch.data_parallel_rank, group, e.medium, h)
            if key not in self.blocks:
                self.unknown_removed += 1
                continue
            self.copies[key] -= 1
            if self.copies[key] > 0:
                continue                   # another copy still holds this hash
            del self.copies[key]
            block = self.blocks.pop(key)
            self.removed.append(block)
            self.cached_per_rank[block.rank] -= 1
        self.removed_total += len(e.block_hashes)
        self._log(batch, "BlockRemoved", len(e.block_hashes),
                  e.block_hashes[0] if e.block_hashes else None, None, None, e.medium)
        return len(e.block_hashes)

    def _clear(self, rank: int) -> None:
        for key in [k for k in self.blocks if k[0] == rank]:
            del self.blocks[key]
            self.copies.pop(key, None)
        self.cached_per_rank[rank] = 0

    def _log(self, batch, kind, n, first, parent, tokens, medium) -> None:
        shown = " ".join(map(str, tokens[:16])) + (" …" if len(tokens) > 16 else "") if tokens \
            else ""
        self.log.append({"seq": batch.seq, "ts": batch.ts, "rank": batch.data_parallel_rank,
                         "event": kind, "blocks": n, "first hash": hash_hex(first)[:12],
                         "parent": hash_hex(parent)[:12], "tokens": shown,
                         "medium": medium or "", "source": batch.source})

    # ---- tables ------------------------------------------------------------------------
    def series_frame(self):
        """One row per batch: seq, time, rank, blocks stored / removed, clears, and the rank's
        cached blocks after it."""
        import pandas as pd
        frame = pd.DataFrame(list(self.series),
                             columns=["seq", "ts", "rank", "stored", "removed", "cleared",
                                      "cached"])
        frame["time"] = pd.to_datetime(frame["ts"], unit="s")
        return frame

    def events_frame(self, n: int = 50):
        """The latest ``n`` events, newest first."""
        import pandas as pd
        rows = list(self.log)[-n:][::-1]
        frame = pd.DataFrame(rows, columns=["seq", "ts", "rank", "event", "blocks", "first hash",
                                            "parent", "tokens", "medium", "source"])
        frame.insert(1, "time", pd.to_datetime(frame.pop("ts"), unit="s").dt.strftime("%H:%M:%S.%f")
                     .str[:-3])
        return frame
