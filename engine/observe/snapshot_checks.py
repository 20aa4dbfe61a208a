"""What every ``StepSnapshot`` the engine records satisfies, checked on a snapshot from
elsewhere (an uploaded trace): ``first_violation`` names the first impossible value.

The invariants (engine/core/invariants.py keeps them on the live pools; a snapshot is their
picture):
- block i of a pool is ``blocks[i]`` (ids are positions), its state agrees with its refcount
  (free / cached: 0, used: 1, shared: > 1, null: the v1 null block, 0), it holds between 0 and
  block_size tokens;
- every entry of a sequence's block table is a block of the pool it lives in;
- a block's refcount is the number of table entries that point at it (sharing is counting);
- the pool's counts add up: free + used (+ the null block) = all blocks, and the stats count
  exactly the blocks listed.
"""
from __future__ import annotations

from collections import Counter

REFCOUNT_OF_STATE = {"free": (0, 0), "cached": (0, 0), "null": (0, 0), "used": (1, 1),
                     "shared": (2, None)}


def first_violation(snap) -> str | None:
    """None if ``snap`` could have been recorded by the engine, else the first violation."""
    bs = snap.block_size
    pools = {"gpu": snap.blocks, "cpu": snap.cpu_blocks}
    for device, blocks in pools.items():
        for i, b in enumerate(blocks):
            if b.block_id != i:
                return f"{device} block at position {i} has id {b.block_id} (ids are positions)"
            if b.ref_count < 0:
                return f"block {b.block_id} has refcount {b.ref_count}"
            low, high = REFCOUNT_OF_STATE.get(b.state, (None, None))
            if low is None:
                return f"block {b.block_id} has an unknown state {b.state!r}"
            if b.ref_count < low or (high is not None and b.ref_count > high):
                return f"block {b.block_id} is {b.state!r} with refcount {b.ref_count}"
            if not 0 <= b.filled <= bs or len(b.token_ids) != b.filled:
                return (f"block {b.block_id} holds {b.filled} tokens ({len(b.token_ids)} listed) "
                        f"in {bs} slots")
    refs = {"gpu": Counter(), "cpu": Counter()}
    for s in snap.sequences:
        blocks = pools.get(s.device)
        if blocks is None:
            return f"seq {s.seq_id} lives on an unknown device {s.device!r}"
        for logical, b in enumerate(s.block_table):
            if not 0 <= b < len(blocks):
                return (f"seq {s.seq_id}, logical block {logical}: block {b} does not exist "
                        f"(the {s.device} pool has {len(blocks)})")
            refs[s.device][b] += 1
        if not 0 <= s.num_computed <= len(s.token_ids):
            return f"seq {s.seq_id} has {s.num_computed} computed of {len(s.token_ids)} tokens"
    if snap.sequences or any(b.ref_count for b in snap.blocks):
        for device, blocks in pools.items():
            for b in blocks:
                if b.ref_count != refs[device][b.block_id]:
                    return (f"block {b.block_id} has refcount {b.ref_count} but "
                            f"{refs[device][b.block_id]} table entries point at it")
    st = snap.stats
    if snap.blocks:
        used = sum(1 for b in snap.blocks if b.ref_count)
        if (st.total_blocks, st.used_blocks) != (len(snap.blocks), used):
            return (f"the stats count {st.total_blocks} blocks, {st.used_blocks} used; the pool "
                    f"lists {len(snap.blocks)}, {used} used")
    if st.free_blocks + st.used_blocks + st.null_blocks != st.total_blocks or \
            min(st.free_blocks, st.used_blocks, st.null_blocks) < 0:
        return (f"free {st.free_blocks} + used {st.used_blocks} + null {st.null_blocks} blocks "
                f"is not the pool's {st.total_blocks}")
    return None
