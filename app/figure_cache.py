"""Figures kept by the inputs they draw (issue 14: "cache figures by snapshot"): every figure on
the page is built through here (app/views/common.py: ``chart``).

A rerun that shows the same step again (a widget moved, a tab reopened, the history scrubbed
back and forth) reuses the figure instead of building it again. A snapshot is immutable, so a
figure built from the same snapshot objects is the same figure. What keys an input:

- an object (a snapshot, a sweep frame): its identity;
- a list or tuple (a history of snapshots): the identity of each element, so a history rebuilt
  as a new list of the same snapshots is the same input;
- a number, string or bytes: its value (e.g. a step number, or the version of a live view
  whose object stays the same while it changes);
- a function (the token decoder): only that there is one; None: that there is none.

Invariant: an entry holds the objects it was built from, so the ids in its key cannot be
reused by other objects while the entry lives; a hit also checks identity, not only ids.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

_VALUES = (bool, int, float, str, bytes)


class FigureCache:
    # small: a figure object is ~55 KB of Python objects, and every session holds its cache;
    # 6 covers the Memory tab's two figures for the shown step and the two before it (fewer
    # steps when the copy-on-write figure, another tab's figures or the Compare tab are drawn)
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
        if arg is None:
            return ("none",)
        if isinstance(arg, _VALUES):
            return ("value", type(arg), arg)
        if isinstance(arg, (list, tuple)):
            return ("seq", tuple(id(a) for a in arg))
        return ("id", id(arg))

    @staticmethod
    def _held(arg):
        # not the decode function itself: it would keep a replaced engine (and its KV pool) alive
        if callable(arg) or arg is None or isinstance(arg, _VALUES):
            return None
        return tuple(arg) if isinstance(arg, (list, tuple)) else arg

    @staticmethod
    def _same(held, arg) -> bool:
        if isinstance(arg, (list, tuple)):
            return len(held) == len(arg) and all(a is b for a, b in zip(held, arg))
        return held is None or held is arg

    def get(self, builder: Callable, *args):
        """``builder(*args)``, or the figure it built before from the same inputs."""
        key = (builder, *(self._key_part(a) for a in args))
        entry = self._entries.get(key)
        if entry is not None and all(self._same(h, a) for h, a in zip(entry[0], args)):
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1]
        self.misses += 1
        figure = builder(*args)
        self._entries[key] = (tuple(self._held(a) for a in args), figure)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return figure

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
