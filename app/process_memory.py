"""The server process's memory: freed pages handed back to the OS, glibc's heaps per thread
limited, the start-up objects frozen out of the cycle collector, and how often it runs
(measured under a class: docs/hosting.md, "A class of 100")."""
from __future__ import annotations

import ctypes
import gc
import os
import sys


def give_back_memory() -> None:
    """Collect, then return the C heap's free pages to the OS (glibc keeps them otherwise, so
    a released session's memory would stay in the server's RSS)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except Exception:                  # not glibc (musl has no malloc_trim): nothing to do
            pass


HEAP_ARENAS = 2            # glibc's malloc arenas: MALLOC_ARENA_MAX, unless the operator set it
_M_ARENA_MAX = -8          # mallopt's parameter number for it (glibc's malloc.h)


def limit_heap_arenas() -> None:
    """At most HEAP_ARENAS glibc heaps for this process's threads (unless MALLOC_ARENA_MAX is
    set). Each session runs its script in a thread of its own, and glibc gives busy threads
    heaps of their own (up to 8 per core); memory freed in them stays mapped. Measured with 50
    protocol-level sessions on one process (deploy/checks/class_load.py): RSS 45 s after they
    left was +12 % over before with glibc's default, +6.7 % with 2 arenas, at the same CPU per
    click within the runs' spread (docs/hosting.md, "A class of 100")."""
    global _arenas_limited
    if _arenas_limited or "MALLOC_ARENA_MAX" in os.environ \
            or not sys.platform.startswith("linux"):
        return
    _arenas_limited = True
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, HEAP_ARENAS)
    except Exception:                  # not glibc (musl has no mallopt arenas): nothing to do
        pass


_arenas_limited = False
_frozen = False


def freeze_long_lived() -> None:
    """Once per process, after the first lab is built (the model loaded, every module
    imported): move every object tracked by Python's cycle collector to its permanent
    generation (``gc.freeze``). A full collection then walks only what came after: with the
    server's ~440k start-up objects it took ~290 ms, holding every session of the process
    (measured in-process), and under a class's clicks it ran every few seconds. Frozen objects
    are still freed by reference counting; only cycles among them are never collected.
    Then the collector's first threshold is raised (GC_THRESHOLDS, below)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)


# Python's default (700, 10, 10) starts a young collection every 700 net container allocations:
# under a class each one walked the young objects of every session's run in flight, every 10th
# also the middle generation, and every full one (131 ms on average) held the whole process.
# One process, 50 protocol students clicking every 2 s for 60 s (docs/hosting.md, "A class of
# 100"): 2694/242/20 collections, 5.0 s in all -> 143/11/1, 1.5 s; CPU per click 0.043 ->
# 0.029 s, click p90 3.2 -> 0.18 s. Cycles are still collected, only less often.
GC_THRESHOLDS = (10_000, 10, 10)
# ...but the full collections that came with it were rarer than once a minute, and in a
# 3-minute class the cyclic garbage waiting for them grew the heap: two
# processes, 100 students, RSS per student at peak 1.7 -> 4.9 MiB and 60 s after they left
# +4 % -> +22 %. So the idle sweeper also runs a full collection this often.
FULL_COLLECTION_S = 30.0


def frozen() -> bool:
    """``freeze_long_lived`` ran: the collector's thresholds are raised, so full collections
    are the idle sweeper's to run (app/idle_sessions.py)."""
    return _frozen
