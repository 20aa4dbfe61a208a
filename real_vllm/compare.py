"""The first difference between our engine's ``StepView`` and real vLLM's, in words.

Fields are compared in the order a reader would look for a cause: what was scheduled and
preempted, the queues, the block tables, ref counts, the free queue, cached hashes, the KV
events, then tokens and finishes. The first that differs is named with the request or block
it concerns (``"seq 1, logical block 2: ours P5, vLLM P7"``), so a failing step reads as a
sentence.
"""
from __future__ import annotations

from real_vllm.state import StepView

THEIRS = "vLLM"


def _dict_diff(what: str, ours: dict, theirs: dict, fmt=str) -> str | None:
    for key in sorted(set(ours) | set(theirs), key=str):
        a, b = ours.get(key), theirs.get(key)
        if a != b:
            return f"{what} of {key}: ours {fmt(a)}, {THEIRS} {fmt(b)}"
    return None


def _tables_diff(ours: dict, theirs: dict) -> str | None:
    for rid in sorted(set(ours) | set(theirs)):
        a, b = ours.get(rid), theirs.get(rid)
        if a == b:
            continue
        if a is None or b is None:
            return (f"request {rid}: holds blocks in "
                    f"{'ours' if b is None else THEIRS} only ({a if b is None else b})")
        for logical in range(max(len(a), len(b))):
            pa = f"P{a[logical]}" if logical < len(a) else "none"
            pb = f"P{b[logical]}" if logical < len(b) else "none"
            if pa != pb:
                return f"request {rid}, logical block {logical}: ours {pa}, {THEIRS} {pb}"
    return None


def _list_diff(what: str, ours: list, theirs: list) -> str | None:
    if ours == theirs:
        return None
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return f"{what}, position {i}: ours {a}, {THEIRS} {b} (ours {ours}, {THEIRS} {theirs})"
    return f"{what}: ours {ours}, {THEIRS} {theirs}"


def first_difference(ours: StepView, theirs: StepView) -> str | None:
    """None when the two steps are identical, else the first difference in words."""
    checks = [
        lambda: _dict_diff("tokens scheduled", ours.scheduled, theirs.scheduled),
        lambda: _list_diff("preempted", ours.preempted, theirs.preempted),
        lambda: _list_diff("running queue", ours.running, theirs.running),
        lambda: _list_diff("waiting queue", ours.waiting, theirs.waiting),
        lambda: _dict_diff("computed tokens", ours.num_computed, theirs.num_computed),
        lambda: _tables_diff(ours.block_tables, theirs.block_tables),
        lambda: _list_diff("ref counts by block", ours.ref_counts, theirs.ref_counts),
        lambda: (None if ours.num_free_blocks == theirs.num_free_blocks else
                 f"free blocks: ours {ours.num_free_blocks}, {THEIRS} {theirs.num_free_blocks}"),
        lambda: _list_diff("free queue", ours.free_queue, theirs.free_queue),
        lambda: _dict_diff("cached hash of block", ours.block_hashes, theirs.block_hashes,
                           lambda h: h[:12] if h else h),
        lambda: _kv_diff(ours.kv_events, theirs.kv_events),
        lambda: _dict_diff("tokens sampled", ours.new_tokens, theirs.new_tokens),
        lambda: _dict_diff("finish reason", ours.finished, theirs.finished),
    ]
    for check in checks:
        found = check()
        if found:
            return f"step {ours.step}: {found}"
    return None


def _kv_diff(ours: list[bytes], theirs: list[bytes]) -> str | None:
    if ours == theirs:
        return None
    from engine.kv_events.wire import decode_batch
    a = [decode_batch(p).events for p in ours]
    b = [decode_batch(p).events for p in theirs]
    if a == b:
        return f"KV event payloads differ in bytes only: ours {ours}, {THEIRS} {theirs}"
    return f"KV events: ours {a}, {THEIRS} {b}"
