"""Per-step KV memory accounting: the paged pool and each contiguous baseline, side by side.

Categories follow the vLLM paper's Fig. 2, in token slots: token states (K/V of a real token),
reserved (will hold a token later), internal fragmentation (never will: for paged, the unfilled
slots of allocated blocks), external fragmentation (free but unusable), and free.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


@dataclass(frozen=True)
class Accounting:
    allocator: str            # "paged", "max", "pow2", "oracle"
    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    running: int              # sequences running after the step
    waiting: int              # requests waiting for memory
    finished: int             # requests finished so far
    rejected: int = 0         # requests that could never fit (contiguous reservations only)

    @property
    def token_state_share(self) -> float:
        """Share of the non-free KV memory that holds token states."""
        busy = self.token_states + self.reserved + self.internal_fragmentation + \
            self.external_fragmentation
        return self.token_states / busy if busy else 1.0


@dataclass(frozen=True)
class Slab:
    """One running request's contiguous reservation in a baseline's linear address space."""
    allocator: str            # "max", "pow2", "oracle"
    request_id: str
    start: int                # first slot
    size: int                 # slots reserved (all of the request's sequences)
    token_states: int         # slots holding K/V now
    reserved: int             # slots that will hold a token later
    internal_fragmentation: int   # slots that never will

    @property
    def wasted(self) -> int:
        return self.size - self.token_states


def paged_accounting(stats, block_size: int, running_seqs: int, finished: int) -> Accounting:
    """From a snapshot's PoolStats: last-block slack is the paged pool's only waste."""
    allocated = stats.used_blocks * block_size
    return Accounting("paged", stats.used_token_slots, 0, allocated - stats.used_token_slots, 0,
                      stats.free_blocks * block_size, running_seqs, stats.num_waiting, finished)


def baseline_accounting(row: dict) -> Accounting:
    return Accounting(row["allocator"], row["token_states"], row["reserved"],
                      row["internal_fragmentation"], row["external_fragmentation"], row["free"],
                      row["running"], row["waiting"], row["finished"], row["rejected"])


def accounting_frame(log) -> pd.DataFrame:
    """One row per (step, allocator) from (step, accountings) pairs, e.g. ``Engine.accounting_log``
    or ``[(s.step, s.accounting) for s in snapshots]``."""
    rows = [{"step": step, **a.__dict__, "token_state_share": a.token_state_share}
            for step, accountings in log for a in accountings]
    return pd.DataFrame(rows)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Time-averaged shares of the busy (non-free) memory and mean running batch, per allocator."""
    g = frame.groupby("allocator", sort=False)
    sums = g[list(CATEGORIES[:-1])].sum()
    busy = sums.sum(axis=1).replace(0, 1)
    out = sums.div(busy, axis=0).mul(100).add_suffix("_%")
    out["mean_running_batch"] = g["running"].mean()
    out["finished"] = g["finished"].max()
    return out
