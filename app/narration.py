"""One short plain-language paragraph per step, built only from the step's events.

``previous`` (the snapshot before the step) is used only to say what a block's refcount was
when a copy-on-write happened; ``decode`` (token ids -> strings) only to quote sampled tokens.
"""
from __future__ import annotations

from collections import defaultdict

from app.figures.common import block_label


def _blocks(ids, device: str = "gpu") -> str:
    ids = list(ids)
    if len(ids) > 6:
        return ", ".join(block_label(b, device) for b in ids[:5]) + f" … ({len(ids)} blocks)"
    return ", ".join(block_label(b, device) for b in ids)


def _seqs(ids) -> str:
    ids = sorted(set(ids))
    return ("seq " if len(ids) == 1 else "seqs ") + ", ".join(map(str, ids))


def narrate(snapshot, previous=None, decode=None, cue: bool = True) -> str:
    """``cue``: end the first step's text with what to press (the page); slides leave it out."""
    events = list(snapshot.events)
    if snapshot.kind == "init":
        queued = snapshot.stats.num_waiting
        if not queued:
            return "Nothing has run yet, and no request is queued."
        return (f"Nothing has run yet: {queued} request{'s are' if queued != 1 else ' is'} "
                "queued and every block of the pool is free." + (" Press Step." if cue else ""))
    if not events:
        return f"Step {snapshot.step} ({snapshot.kind}): nothing to run — no memory changed."
    by = defaultdict(list)
    first: dict[str, int] = {}
    for i, e in enumerate(events):
        by[e.kind].append(e)
        first.setdefault(e.kind, i)
    said: list[tuple[int, int, str]] = []         # (event position, order said, sentence)

    def say(at: int, text: str) -> None:
        said.append((at, len(said), text))

    if snapshot.kind == "mixed":
        say(-1, "This v1 step mixed decode tokens and prompt chunks in one batch (one token "
                "budget, no separate prefill and decode steps).")
    if by["preempt"] and snapshot.kind == "reset":     # one reason for all of them
        say(first["preempt"],
            f"To reset the prefix cache mid-run, {_seqs(e.seq_id for e in by['preempt'])}"
            f" {'was' if len(by['preempt']) == 1 else 'were'} preempted. "
            f"{by['preempt'][0].rule}.")
    elif by["preempt"]:
        for e in by["preempt"]:
            at = events.index(e)
            if e.rule:                  # v1 says which rule chose the victim
                say(at, f"The pool ran dry: seq {e.seq_id} was preempted. {e.rule}.")
                continue
            say(at, f"The pool ran dry: seq {e.seq_id} was preempted ({e.mode}"
                + (": its blocks were freed and its prompt will be computed again later)."
                   if e.mode == "recompute" else ": its blocks move to the CPU pool)."))
    for e in by["swap_out"]:
        say(events.index(e), f"seq {e.seq_id} swapped out: "
            + ", ".join(f"{block_label(s)}→{block_label(d, 'cpu')}" for s, d in e.mapping[:4])
            + (" …" if len(e.mapping) > 4 else "."))
    for e in by["swap_in"]:
        say(events.index(e), f"seq {e.seq_id} swapped back in: "
            + ", ".join(f"{block_label(s, 'cpu')}→{block_label(d)}" for s, d in e.mapping[:4])
            + (" …" if len(e.mapping) > 4 else "."))
    chunks = [e for e in by["prefill"] if e.total is not None]
    whole = [e for e in by["prefill"] if e.total is None]
    if whole:
        ranges = "; ".join(f"seq {e.seq_id} tokens {e.start}–{e.end - 1}" for e in whole[:4])
        more = f" (+{len(whole) - 4} more)" if len(whole) > 4 else ""
        say(events.index(whole[0]), f"Prefill computed K/V for {ranges}{more}.")
    if chunks:
        parts = "; ".join(f"seq {e.seq_id} tokens {e.start}–{e.end - 1} of {e.total}"
                          + (" (the last chunk: it samples now)" if e.end == e.total else "")
                          for e in chunks[:4])
        more = f" (+{len(chunks) - 4} more)" if len(chunks) > 4 else ""
        say(events.index(chunks[0]),
            f"Prefill chunk: {parts}{more}. A chunk is what is left of the step's token "
            "budget; a request samples only once its whole prompt is computed.")
    if by["prefix_hit"]:
        hits = defaultdict(list)
        for e in by["prefix_hit"]:
            hits[e.seq_id].append(e.physical)
        say(first["prefix_hit"], "Prefix cache hit: " + "; ".join(
            f"seq {s} reused {_blocks(b)} (not recomputed)" for s, b in hits.items()) + ".")
    if by["cached"]:
        say(first["cached"],
            f"{len(by['cached'])} full block(s) entered the prefix cache ("
            + _blocks(e.physical for e in by["cached"]) + "): later requests with the same "
            "prefix can reuse them.")
    for e in by["cache_reset"]:
        say(events.index(e), "The prefix cache was reset: every cached block forgot its hash.")
    for e in by["evict"]:
        say(events.index(e), f"Cached block {block_label(e.physical)} was evicted (reallocated).")
    cow_dst = {e.dst for e in by["cow"]}
    freed_at = {}                        # block -> position of its (last) free before now
    for i, e in enumerate(events):
        if e.kind == "free" and e.device == "gpu":
            freed_at[e.physical] = i
    if any(e.physical not in cow_dst for e in by["alloc"]):
        allocs = defaultdict(list)
        reused = []
        at = None
        for e in by["alloc"]:
            if e.physical in cow_dst:       # told below, with the copy
                continue
            i = events.index(e)
            at = i if at is None else at
            allocs[e.seq_id].append(e.physical)
            if freed_at.get(e.physical, i) < i:
                reused.append(e.physical)
        say(at, "New blocks: " + "; ".join(f"seq {s} ← {_blocks(b)}" for s, b in allocs.items())
            + (f" ({_blocks(reused)} freed earlier in this step and handed out again)"
               if reused else "") + ".")
    if by["fork"]:
        forks = defaultdict(list)
        for e in by["fork"]:
            forks[e.parent_seq_id].append(e)
        for parent, fs in forks.items():
            phys = fs[-1].physicals
            who = "the child shares" if len(fs) == 1 else "the children share"
            say(events.index(fs[0]),
                f"seq {parent} forked into {_seqs(f.child_seq_id for f in fs)}: "
                f"{who} its blocks {_blocks(phys)} (refcount +{len(fs)} each); "
                "no K/V was copied.")
    if by["cow"]:
        rc = {b.block_id: b.ref_count for b in previous.blocks} if previous else {}
        parts = []
        for e in by["cow"]:
            before = rc.get(e.src)
            parts.append(f"seq {e.seq_id} wrote into shared block {block_label(e.src)}"
                         + (f" (refcount {before})" if before else "")
                         + f" → copied to {block_label(e.dst)}")
            if before:
                rc[e.src] = before - 1
        say(first["cow"], "Copy-on-write: " + "; ".join(parts) + ".")
        copied = {e.src for e in by["cow"]}
        inplace = [e for e in by["append"] if e.physical in copied]
        for e in inplace:
            say(events.index(e),
                f"seq {e.seq_id}, the last sharer of {block_label(e.physical)}, wrote in place.")
    if by["append"] and not by["cow"]:
        who = {e.seq_id for e in by["append"]}
        say(first["append"], f"{_seqs(who).capitalize()} wrote one token's K/V"
            + (" each into the last block of their tables." if len(who) > 1 else
               f" into slot {by['append'][0].slot % snapshot.block_size} of "
               f"{block_label(by['append'][0].physical)}."))
    if by["sample"]:
        if decode and len(by["sample"]) <= 6:
            toks = decode([e.token_id for e in by["sample"]])
            say(first["sample"], "Sampled: " + ", ".join(
                f"seq {e.seq_id} {t!r}" for e, t in zip(by["sample"], toks)) + ".")
        else:
            say(first["sample"], f"Sampled {len(by['sample'])} new token(s).")
    if by["beam_prune"]:
        ids = sorted({e.seq_id for e in by["beam_prune"]})
        one = len(ids) == 1
        say(first["beam_prune"],
            f"Pruned {'beam' if one else 'beams'} {', '.join(map(str, ids))}: lower "
            f"score than the kept candidates; {'its' if one else 'their'} blocks were "
            "released.")
    if by["finish"]:
        reasons = defaultdict(list)
        for e in by["finish"]:
            reasons[e.reason].append(e.seq_id)
        say(first["finish"], "Finished: " + "; ".join(
            f"{_seqs(ids)} ({r})" for r, ids in reasons.items()) + ".")
    for run in _runs(events, "free"):    # frees with other events between them: apart
        cached = [e.physical for e in run if e.cached]
        say(events.index(run[0]),
            f"{len(run)} block(s) reached refcount 0 and returned to the free list"
            + (f" ({len(cached)} keep their content in the prefix cache)" if cached else "")
            + (": " + ", ".join(block_label(e.physical, e.device) for e in run)
               if len(run) <= 6 else "") + ".")
    said.sort()
    return f"Step {snapshot.step} ({snapshot.kind}): " + " ".join(t for _, _, t in said)


def _runs(events, kind: str) -> list[list]:
    """The events of ``kind`` in runs: a run ends where an event of a kind that changes blocks
    (alloc, prefix hit, cow, swap, fork) comes between two of them."""
    runs, current = [], []
    for e in events:
        if e.kind == kind:
            current.append(e)
        elif current and e.kind in ("alloc", "prefix_hit", "cow", "swap_in", "swap_out",
                                    "fork"):
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs
