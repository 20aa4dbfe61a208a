"""The memory rules (docs/architecture.md#memory-rules), checked against the live state.

Each failure raises AssertionError whose message names the broken invariant. Called between
steps (after ``Engine.step`` or ``abort_request`` returns), never inside one.
"""
from __future__ import annotations

from collections import Counter

from engine.core.block_math import cdiv
from engine.core.hashing import block_extra_keys, hash_block
from engine.core.kv_cache_base import KVCacheBase
from engine.core.block_pool import BlockPool
from engine.core.sequence import Sequence, SequenceGroup, SeqStatus

# the pool a live sequence's table must point into, by status (WAITING holds no blocks)
_DEVICE_OF = {SeqStatus.RUNNING: "gpu", SeqStatus.SWAPPED: "cpu"}
# the scheduler queue a group with live sequences of this status must be in
_QUEUE_OF = {SeqStatus.WAITING: "waiting", SeqStatus.RUNNING: "running",
             SeqStatus.SWAPPED: "swapped"}

HASH_CHAIN = "every cached block's hash matches its tokens and its predecessor"
CACHE_MAP = "the cache map and block hashes agree"
STATUS_QUEUE = "statuses match queues"
NO_PENDING_COPIES = "no pending copies between steps"
NULL_BLOCK = "the null block is in no table, not free and never cached"
TABLE_POOL = "swapped sequences' blocks are in the CPU pool, running ones' in the GPU pool"


def _fail(name: str, detail: str) -> None:
    raise AssertionError(f"invariant '{name}' broken: {detail}")


def check_invariants(bm: KVCacheBase, groups: list[SequenceGroup], scheduler) -> None:
    bs = bm.block_size
    # first: the block checks below trust that live sequences are waiting, running or swapped
    _check_queues(groups, scheduler)
    refs = {"gpu": Counter(), "cpu": Counter()}
    for g in groups:
        for s in g.done_seqs:
            if s.block_table:
                _fail("finished sequences hold no blocks", f"seq {s.seq_id} holds {s.block_table}")
        for s in g.seqs:
            if s.status == SeqStatus.WAITING:
                if s.block_table:
                    _fail("waiting sequences hold no blocks", f"seq {s.seq_id}")
                continue
            pool = _table_pool(bm, s)
            want = cdiv(s.num_computed, bs)
            if len(s.block_table) != want:
                _fail("table covers ceil(L/B) blocks",
                      f"seq {s.seq_id}: {len(s.block_table)} blocks for {s.num_computed} cached tokens")
            for i, b in enumerate(s.block_table):
                refs[pool.device][b] += 1
                expect = s.token_ids[i * bs:min((i + 1) * bs, s.num_computed)]
                if pool.tokens[b] != expect:
                    _fail("block content matches every owner (no shared block written)",
                          f"seq {s.seq_id} logical {i} -> {pool.device} block {b} holds "
                          f"{pool.tokens[b]}, expected {expect}")
            _check_seq_hashes(s, pool, bs)
    for pool in bm.pools.values():
        for b in range(pool.num_blocks):
            if pool.ref_count[b] != refs[pool.device][b]:
                _fail("refcounts match table references",
                      f"{pool.device} block {b}: ref_count {pool.ref_count[b]}, "
                      f"{refs[pool.device][b]} table references")
            if b == pool.null_block:
                if b in pool.free_queue or pool.ref_count[b] or pool.block_hash[b]:
                    _fail(NULL_BLOCK, f"{pool.device} block {b} is referenced, free or cached")
                continue
            if (pool.ref_count[b] == 0) != (b in pool.free_queue):
                _fail("free list holds exactly the blocks with refcount 0",
                      f"{pool.device} block {b} ref_count {pool.ref_count[b]}")
        used = sum(1 for rc in pool.ref_count if rc)
        if used + pool.num_free != pool.num_usable:
            _fail("free + used = total", f"{pool.device}: {used} + {pool.num_free} != "
                                         f"{pool.num_usable}")
        for b in pool.hashed_blocks():
            if len(pool.tokens[b]) != bs:
                _fail("prefix cache maps hashes to full blocks", f"{pool.device} block {b}")
        _check_cache_map(pool)
        _check_block_hashes(pool)
    for g in groups:
        for s in g.seqs:
            if bm.gpu.null_block is not None and bm.gpu.null_block in s.block_table \
                    and s.block_device == "gpu":
                _fail(NULL_BLOCK, f"seq {s.seq_id}'s table holds the null block")
    if bm.unscheduled_copies():
        # the scheduler hands them to the step's batch; left here they would be run late, or
        # never, and the copied-to block would hold garbage K/V
        _fail(NO_PENDING_COPIES, f"{bm.unscheduled_copies()}")
    if not scheduler.has_unfinished():
        leaked = [b for pool in bm.pools.values() for b in range(pool.num_blocks)
                  if pool.ref_count[b]]
        if leaked:
            _fail("no leak after all requests finish", f"blocks {leaked} still referenced")


def _table_pool(bm: KVCacheBase, s: Sequence) -> BlockPool:
    """The pool ``s``'s table points into, which must be the one its status implies, and every
    entry a referenced block of it (a swapped sequence decoding from GPU ids, or a running one
    reading CPU ids, would read another sequence's K/V)."""
    want = _DEVICE_OF.get(s.status)
    if s.block_device != want:
        _fail(TABLE_POOL, f"seq {s.seq_id} is {s.status.value} but its table is on "
                          f"{s.block_device!r}")
    pool = bm.pool_of(s)
    for i, b in enumerate(s.block_table):
        if not (0 <= b < pool.num_blocks and pool.ref_count[b] > 0):
            _fail(TABLE_POOL, f"seq {s.seq_id} logical {i} -> {b} is not a referenced "
                              f"{pool.device} block")
    return pool


def _check_seq_hashes(s: Sequence, pool: BlockPool, bs: int) -> None:
    """A sequence's own hash chain matches its tokens, and each hashed block in its table
    carries this chain's hash at that position (so a prefix hit on it serves this prefix)."""
    parent = ""
    for i, h in enumerate(s.block_hashes):
        tokens = s.token_ids[i * bs:(i + 1) * bs]
        if h != hash_block(parent, tokens, block_extra_keys(s.cache_salt, i)):
            _fail(HASH_CHAIN, f"seq {s.seq_id} block_hashes[{i}] does not match its tokens")
        parent = h
    for i, b in enumerate(s.block_table):
        h = pool.block_hash[b]
        if h is None:
            continue
        if i >= len(s.block_hashes) or h != s.block_hashes[i]:
            _fail(HASH_CHAIN, f"seq {s.seq_id} logical {i} -> {pool.device} block {b} is cached "
                              f"under another prefix's hash")
        if pool.parent_hash[b] != (s.block_hashes[i - 1] if i else ""):
            _fail(HASH_CHAIN, f"{pool.device} block {b}: its parent hash is not the hash of "
                              f"seq {s.seq_id}'s logical block {i - 1}")


def _check_block_hashes(pool: BlockPool) -> None:
    """Every hashed block, used or cached-free, hashes to its tokens chained from its stored
    parent hash; the parent block itself may be gone (evicted) by now."""
    for b in range(pool.num_blocks):
        h = pool.block_hash[b]
        if h is None:
            continue
        parent = pool.parent_hash[b]
        if parent is None or h != hash_block(parent, pool.tokens[b], pool.extra_keys[b]):
            _fail(HASH_CHAIN, f"{pool.device} block {b}: hash {h} is not the hash of its tokens "
                              f"{pool.tokens[b]} chained from {parent!r}")


def _check_cache_map(pool: BlockPool) -> None:
    """``block_hash[b] == h`` iff ``cached[h] == b`` or ``b in copies[h]``: a lookup finds a
    block of every cached hash, and only hashed blocks are in the map."""
    listed = {}
    for h, b in pool.cached.items():
        listed[b] = h
    for h, bs in pool.copies.items():
        if not bs or h not in pool.cached:
            _fail(CACHE_MAP, f"copies[{h}] = {bs} but cached has no block for that hash")
        for b in bs:
            if b in listed:
                _fail(CACHE_MAP, f"{pool.device} block {b} is in the cache map twice")
            listed[b] = h
    for b, h in listed.items():
        if pool.block_hash[b] != h:
            _fail(CACHE_MAP, f"the cache map lists {pool.device} block {b} under {h}, but its "
                             f"hash is {pool.block_hash[b]}")
    for b in range(pool.num_blocks):
        h = pool.block_hash[b]
        if h is not None and listed.get(b) != h:
            _fail(CACHE_MAP, f"{pool.device} block {b} has hash {h} but the cache map does "
                             f"not list it")


def _check_queues(groups: list[SequenceGroup], scheduler) -> None:
    """Each unfinished request sits in exactly one queue, the one its live sequences' status
    names; finished and pruned sequences are only in ``done_seqs``; finished requests are in
    no queue. (Queues are compared by identity: groups are dataclasses with field equality.)"""
    queued: dict[int, list[str]] = {}
    known = {id(g) for g in groups}
    for name, queue in scheduler.queues().items():
        for g in queue:
            if id(g) not in known:
                _fail(STATUS_QUEUE, f"request {g.request_id} in {name} is not a known request")
            queued.setdefault(id(g), []).append(name)
    for g in groups:
        where = queued.get(id(g), [])
        for s in g.done_seqs:
            if not s.is_finished:
                _fail(STATUS_QUEUE, f"seq {s.seq_id} is {s.status.value} but in done_seqs")
        for s in g.seqs:
            if s.is_finished:
                _fail(STATUS_QUEUE, f"seq {s.seq_id} is {s.status.value} but still live")
        if not g.seqs:
            if where:
                _fail(STATUS_QUEUE, f"finished request {g.request_id} is still in {where}")
            continue
        if len(where) != 1:
            _fail(STATUS_QUEUE, f"request {g.request_id} is in {where or 'no queue'}")
        for s in g.seqs:
            if _QUEUE_OF[s.status] != where[0]:
                _fail(STATUS_QUEUE, f"seq {s.seq_id} is {s.status.value} but request "
                                    f"{g.request_id} is in {where[0]}")
