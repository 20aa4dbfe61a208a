"""Sessions take turns: in one server process, one session at a time works on its lab (steps
its engine, draws its view), in the order they asked.

Streamlit runs every session's script in a thread of its own, and the threads share one
interpreter lock that changes hands every 5 ms. When a class's clicks arrive faster than a
moment's work, many runs are in flight at once, each evicting the others' data from the CPU's
caches at every switch: a click then costs more CPU, more runs pile up, and the process
collapses to a lower throughput it does not leave while the clicks keep coming. Measured with
protocol-level students (deploy/checks/class_load.py; docs/hosting.md, "A class of 100"): one
process, 60 students clicking every 2 s (30 clicks/s): the first 20 s served at p90 0.25 s,
then the CPU per click rose 0.030 -> 0.040 s and p90 to 4.4 s; taking turns, the same 60 were
served at p90 0.20 s with 0.026 s of CPU per click, all 30 clicks/s.

The turn is taken by ``Lab.in_use`` (app/lab.py), so it covers a callback's engine step, the
sidebar and the main view. Long work hands the turn on: Run N and the Compare tab's runs after
each step (``pass_turn``), a real vLLM start for as long as it starts (``paused``), so no
session waits behind more than one step of another's. A thread may take the turn again while
it holds it (nested ``in_use``). PAGED_LAB_TAKE_TURNS=0 (app/hosting.py) turns it off.
"""
from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager


class Turns:
    """A re-entrant lock granted in arrival order (``threading.Lock`` wakes any waiter: under
    a class's load some waited many turns). Invariants: ``_owner`` is None only when no one
    waits; a released turn goes straight to the first waiter, which is ``_owner`` (at
    ``_depth`` 0) from then until it wakes and sets its depth."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiting: deque[tuple[int, threading.Event]] = deque()   # (thread id, its wake-up)
        self._owner: int | None = None
        self._depth = 0

    # ---- the lock --------------------------------------------------------------------------
    def acquire(self, depth: int = 1) -> None:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += depth
                return
            if self._owner is None:
                self._owner, self._depth = me, depth
                return
            woken = threading.Event()
            self._waiting.append((me, woken))
        woken.wait()                         # the releaser made us the owner before waking us
        with self._mutex:
            self._depth = depth

    def release(self) -> None:
        with self._mutex:
            self._check_owner()
            self._depth -= 1
            if self._depth == 0:
                self._hand_on()

    def __enter__(self) -> "Turns":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- long work -------------------------------------------------------------------------
    def pass_turn(self) -> None:
        """Between two pieces of long work: the sessions waiting now go first, then this one
        goes on (nothing happens when no one waits or the thread holds no turn)."""
        me = threading.get_ident()
        with self._mutex:
            if self._owner != me or not self._waiting:
                return
            depth = self._depth
            self._hand_on()
        self.acquire(depth)

    @contextmanager
    def paused(self):
        """Work that waits on something outside this process (real vLLM starting): the turn
        goes to the others meanwhile and comes back after, at the same depth."""
        me = threading.get_ident()
        with self._mutex:
            depth = self._depth if self._owner == me else 0
            if depth:
                self._hand_on()
        try:
            yield
        finally:
            if depth:
                self.acquire(depth)

    # ---- inside the mutex ------------------------------------------------------------------
    def _hand_on(self) -> None:
        if self._waiting:
            self._owner, woken = self._waiting.popleft()
            self._depth = 0                  # the new owner sets its own depth when it wakes
            woken.set()
        else:
            self._owner, self._depth = None, 0

    def _check_owner(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("a turn released by a thread that does not hold it")


TURNS = Turns()                          # one per server process: the sessions' shared CPU
