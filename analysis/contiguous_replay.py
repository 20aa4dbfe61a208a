"""One contiguous baseline (engine/observe/baselines/contiguous.py) replayed on lengths, a stretch at a time.

``ContiguousAllocator.step`` touches every running request every step. When no request ends
early (every output is exactly max_tokens long, as in analysis/length_replay.py) the allocator
only changes at its own events -- an arrival, a step that admits (a prefill step), a step that
retires -- and between them every running request just gains one token per step. So this walks
from event to event with the allocator's rules (FCFS, first fit in the engine's own
``FirstFitSpace``, a prefill step advances only the requests it admits) and writes each quiet
stretch as one segment: constant columns plus token states rising, and reserved falling, by the
number running per step. Checked against the engine by tests/engine/test_length_replay.py.
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from engine.observe.baselines.address_space import FirstFitSpace
from engine.observe.baselines.contiguous import reservation

# the accounting columns of ContiguousAllocator.accounting(), in Accounting's order
COLUMNS = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation",
           "free", "running", "waiting", "finished", "rejected")


def extents(policy: str, prompt_len, output_len, max_model_len: int) -> list[int]:
    """Slots each request (one sequence) reserves: ContiguousAllocator._extent's rule."""
    return [min(reservation(policy, p, o, max_model_len), max(max_model_len, p + o))
            for p, o in zip(prompt_len, output_len)]


def replay_contiguous(policy: str, capacity_slots: int, max_model_len: int, add_step,
                      prompt_len, output_len, num_steps: int) -> dict[str, np.ndarray]:
    """Accounting after each of ``num_steps`` engine steps (``add_step[i]``: the 0-based step
    before which request i is added, non-decreasing). Returns one int64 array per column."""
    n = len(prompt_len)
    P, O = list(prompt_len), list(output_len)
    ext = extents(policy, P, O, max_model_len)
    space = FirstFitSpace(capacity_slots)
    waiting: deque[int] = deque()
    retire: list[tuple[int, int, int]] = []   # (decode count when it retires, request, start)
    segments: list[tuple] = []                # (length, slope, the first row's columns...)
    decodes = token = reserved = internal = running = finished = rejected = 0
    free_total = capacity_slots
    dirty = True              # space or head changed since the head last failed to fit

    def emit(length: int, slope: int) -> None:
        head = ext[waiting[0]] if waiting else None
        external = free_total if head is not None and free_total >= head else 0
        segments.append((length, slope, token, reserved, internal, external,
                         free_total - external, running, len(waiting), finished, rejected))

    def retire_one(r: int, start: int) -> None:
        nonlocal token, reserved, internal, free_total, running, finished, dirty
        token -= P[r] + O[r] - 1
        reserved -= 1
        internal -= ext[r] - P[r] - O[r]
        free_total += ext[r]
        space.free(start)
        running -= 1
        finished += 1
        dirty = True

    s = a = 0
    while s < num_steps:
        while a < n and add_step[a] <= s:
            if ext[a] > space.size:
                rejected += 1
            else:
                dirty = dirty or not waiting
                waiting.append(a)
            a += 1
        next_add = add_step[a] if a < n else num_steps
        admitted = []
        if waiting and dirty:
            while waiting:
                start = space.allocate(ext[waiting[0]])
                if start is None:
                    break
                admitted.append((waiting.popleft(), start))
            dirty = False
        if admitted:          # a prefill step: only the admitted requests get a token
            for r, start in admitted:
                token += P[r]
                reserved += O[r]
                internal += ext[r] - P[r] - O[r]
                free_total -= ext[r]
                running += 1
                heapq.heappush(retire, (decodes + O[r] - 1, r, start))
            while retire and retire[0][0] == decodes:     # output_len 1: done at admission
                retire_one(*heapq.heappop(retire)[1:])
            emit(1, 0)
            s += 1
            continue
        # decode steps (or nothing to do) until the next arrival or retirement
        k = min(num_steps, next_add) - s
        if retire:
            k = min(k, retire[0][0] - decodes)
        ends = bool(retire) and retire[0][0] - decodes == k
        quiet = k - 1 if ends else k
        if quiet:
            token += running
            reserved -= running
            emit(quiet, running)
            token += running * (quiet - 1)
            reserved -= running * (quiet - 1)
            decodes += quiet
            s += quiet
        if ends:              # its row is written after the retirements
            token += running
            reserved -= running
            decodes += 1
            while retire and retire[0][0] == decodes:
                retire_one(*heapq.heappop(retire)[1:])
            emit(1, 0)
            s += 1
    return expand(segments)


def expand(segments: list[tuple]) -> dict[str, np.ndarray]:
    """Segments to per-step columns: token states + slope * i, reserved - slope * i."""
    if not segments:
        return {c: np.zeros(0, dtype=np.int64) for c in COLUMNS}
    seg = np.array(segments, dtype=np.int64)
    lengths = seg[:, 0]
    offset = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    rise = np.repeat(seg[:, 1], lengths) * offset
    cols = {c: np.repeat(seg[:, 2 + i], lengths) for i, c in enumerate(COLUMNS)}
    cols["token_states"] += rise
    cols["reserved"] -= rise
    return cols
