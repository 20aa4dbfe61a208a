"""Figures kept by the snapshots they draw (issue 14: "cache figures by snapshot").

A rerun that shows the same step again (a widget moved, a tab reopened, the history scrubbed
back and forth) reuses the figure instead of building it again. A snapshot is immutable, so a
figure built from the same snapshot objects is the same figure.

Invariant: an entry holds the snapshots it was built from, so the ids in its key cannot be
reused by other objects while the entry lives; a hit also checks identity, not only ids.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable


class FigureCache:
    # small: a figure object is ~55 KB of Python objects, and every session holds its cache;
    # 6 covers the Memory tab's two figures for the shown step and the two before it (fewer
    # steps when the copy-on-write figure or the Compare tab is drawn too)
    def __init__(self, capacity: int = 6):
        self.capacity = capacity
        self._entries: OrderedDict[tuple, tuple[tuple, Any]] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def _key_part(arg) -> tuple:
        # a decode function is rebuilt on every access (Lab.decode): only whether text is
        # shown matters, and that is fixed for a given snapshot of a given lab
        if callable(arg):
            return ("decode",)
        return ("none",) if arg is None else ("id", id(arg))

    @staticmethod
    def _held(args: tuple) -> tuple:
        # not the decode function itself: it would keep a replaced engine (and its KV pool) alive
        return tuple(None if callable(a) else a for a in args)

    def get(self, builder: Callable, *args):
        """``builder(*args)``, or the figure it built before from the same snapshot objects."""
        key = (builder, *(self._key_part(a) for a in args))
        entry = self._entries.get(key)
        if entry is not None and all(a is b for a, b in zip(entry[0], self._held(args))):
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]
        self.misses += 1
        figure = builder(*args)
        self._entries[key] = (self._held(args), figure)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return figure

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
