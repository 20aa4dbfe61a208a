"""The memory rules of DESIGN §4, checked against the engine's live state.

Each failure raises AssertionError whose message names the broken invariant.
"""
from __future__ import annotations

from collections import Counter

from engine.block_manager import BlockManager
from engine.sequence import SequenceGroup, SeqStatus


def _fail(name: str, detail: str) -> None:
    raise AssertionError(f"invariant '{name}' broken: {detail}")


def check_invariants(bm: BlockManager, groups: list[SequenceGroup], scheduler) -> None:
    bs = bm.block_size
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
            pool = bm.pool_of(s)
            want = -(-s.num_computed // bs)
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
    for pool in (bm.gpu, bm.cpu):
        for b in range(pool.num_blocks):
            if pool.ref_count[b] != refs[pool.device][b]:
                _fail("refcounts match table references",
                      f"{pool.device} block {b}: ref_count {pool.ref_count[b]}, "
                      f"{refs[pool.device][b]} table references")
            if (pool.ref_count[b] == 0) != (b in pool.free_queue):
                _fail("free list holds exactly the blocks with refcount 0",
                      f"{pool.device} block {b} ref_count {pool.ref_count[b]}")
        used = sum(1 for rc in pool.ref_count if rc)
        if used + pool.num_free != pool.num_blocks:
            _fail("free + used = total", f"{pool.device}: {used} + {pool.num_free} != {pool.num_blocks}")
        for h, b in pool.cached.items():
            if pool.block_hash[b] != h or len(pool.tokens[b]) != bs:
                _fail("prefix cache maps hashes to full blocks", f"{pool.device} block {b}")
    if not scheduler.has_unfinished():
        leaked = [b for b in range(bm.gpu.num_blocks) if bm.gpu.ref_count[b]]
        leaked += [b for b in range(bm.cpu.num_blocks) if bm.cpu.ref_count[b]]
        if leaked:
            _fail("no leak after all requests finish", f"blocks {leaked} still referenced")
