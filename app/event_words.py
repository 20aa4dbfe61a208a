"""One event in plain words, as the narration says it (app/narration.py tells a whole step; this
tells each event on its own, for the Events tab's list, with the raw fields one click away).
Only the event and the block size are read; ``decode`` (token ids -> strings) quotes tokens."""
from __future__ import annotations

from typing import Callable

from app.figures.common import block_label


def _tok(token_id: int, decode: Callable | None) -> str:
    return f"{decode([token_id])[0]!r} (token {token_id})" if decode else f"token {token_id}"


def _moves(mapping, src: str, dst: str) -> str:
    shown = ", ".join(f"{block_label(a, src)}→{block_label(b, dst)}" for a, b in mapping[:4])
    return shown + (" …" if len(mapping) > 4 else "")


WORDS: dict[str, Callable] = {
    "alloc": lambda e, bs, d: f"seq {e.seq_id} got a new block: logical block {e.logical} → "
                              f"{block_label(e.physical)}",
    "free": lambda e, bs, d: f"{block_label(e.physical, e.device)} reached refcount 0 and "
                             "returned to the free list"
                             + (" (its content stays in the prefix cache)" if e.cached else ""),
    "evict": lambda e, bs, d: f"cached block {block_label(e.physical)} was evicted to be "
                              f"reused (hash {e.block_hash[:12]} forgotten)",
    "fork": lambda e, bs, d: f"seq {e.parent_seq_id} forked seq {e.child_seq_id}: the child "
                             f"shares its {len(e.physicals)} block(s), no K/V copied",
    "cow": lambda e, bs, d: f"copy-on-write: seq {e.seq_id} wrote into shared block "
                            f"{block_label(e.src)}, so its logical block {e.logical} was copied "
                            f"to {block_label(e.dst)}",
    "prefill": lambda e, bs, d: f"seq {e.seq_id}: prompt tokens {e.start}–{e.end - 1} computed"
                                + (f" (of {e.total})" if e.total is not None else ""),
    "append": lambda e, bs, d: f"seq {e.seq_id} wrote one token's K/V into slot {e.slot % bs} "
                               f"of {block_label(e.physical)} (logical block {e.logical})",
    "prefix_hit": lambda e, bs, d: f"prefix cache hit: seq {e.seq_id}'s logical block "
                                   f"{e.logical} is {block_label(e.physical)}, found by hash "
                                   f"{e.block_hash[:12]} (not recomputed)",
    "cached": lambda e, bs, d: f"{block_label(e.physical)} (full, seq {e.seq_id}) entered the "
                               f"prefix cache as hash {e.block_hash[:12]}",
    "cache_reset": lambda e, bs, d: "the prefix cache was reset: every cached block forgot "
                                    "its hash",
    "preempt": lambda e, bs, d: f"seq {e.seq_id} was preempted ({e.mode})"
                                + (f": {e.rule}" if e.rule else ""),
    "swap_out": lambda e, bs, d: f"seq {e.seq_id} swapped out: {_moves(e.mapping, 'gpu', 'cpu')}",
    "swap_in": lambda e, bs, d: f"seq {e.seq_id} swapped in: {_moves(e.mapping, 'cpu', 'gpu')}",
    "sample": lambda e, bs, d: f"seq {e.seq_id} sampled {_tok(e.token_id, d)}, "
                               f"logprob {e.logprob:.2f}",
    "beam_prune": lambda e, bs, d: f"beam seq {e.seq_id} was pruned ({e.reason}); its blocks "
                                   "were released",
    "finish": lambda e, bs, d: f"seq {e.seq_id} finished ({e.reason})",
}


def describe(event, block_size: int, decode: Callable | None = None) -> str:
    """``event`` in one plain sentence; a kind this page does not know, by its fields."""
    words = WORDS.get(event.kind)
    if words is None:
        fields = ", ".join(f"{k} {v}" for k, v in event.to_dict().items() if k != "kind")
        return f"{event.kind}: {fields}"
    return words(event, block_size, decode)
