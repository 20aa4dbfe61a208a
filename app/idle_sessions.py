"""Idle and disconnected sessions: their labs are released (engine, history, a real-vLLM slot
given back) by a sweep any visit runs and a daemon thread runs every few seconds; a session
that comes back gets a fresh engine (``Lab.revive``)."""
from __future__ import annotations

import gc
import logging
import threading
import time

from app import hosting, process_memory
from app.labs import shown_labs
from app.process_memory import FULL_COLLECTION_S, give_back_memory

log = logging.getLogger(__name__)


def release_idle_labs(now: float | None = None, idle_s: float | None = None,
                      labs=None, is_connected=None, disconnected_s: float | None = None) -> int:
    """Release every lab (of this process, or ``labs``) idle for more than ``idle_s`` (default:
    PAGED_LAB_IDLE_MINUTES), and, given ``is_connected(session_id)``, every lab whose session
    has been disconnected for more than ``disconnected_s`` (default: PAGED_LAB_DISCONNECTED_SECONDS,
    which defaults to Streamlit's reconnect window); returns how many. A playing lab is never
    idle. Freed memory is handed back to the OS, so the server's RSS comes down too."""
    idle_s = hosting.idle_seconds() if idle_s is None else idle_s
    if is_connected is not None and disconnected_s is None:
        disconnected_s = hosting.disconnected_seconds()
    now = time.monotonic() if now is None else now
    if labs is None:
        labs = shown_labs()
    released = 0
    for lab in labs:
        if lab.released:
            continue
        if is_connected is not None and lab.session_id is not None:
            if is_connected(lab.session_id):
                lab.disconnected_since = None
            elif lab.disconnected_since is None:
                lab.disconnected_since = now
        gone = (lab.disconnected_since is not None and disconnected_s is not None
                and now - lab.disconnected_since > disconnected_s)
        if not (gone or _idle(lab, now, idle_s)):
            continue
        if not lab._lock.acquire(blocking=False):
            continue                     # a script run is using it right now: not idle
        try:                 # asked again: a run may have just touched it, the tab come
            if lab.released:     # back, or another sweep released it meanwhile
                continue
            gone = gone and not (is_connected is not None and is_connected(lab.session_id))
            if gone or _idle(lab, now, idle_s):
                lab.release("disconnected" if gone else "idle")
                released += 1
        finally:
            lab._lock.release()
    if released:
        log.info("released %d idle or disconnected session(s)", released)
        give_back_memory()
    return released


def _idle(lab, now: float, idle_s: float | None) -> bool:
    """Idle past the limit; a playing lab is never idle."""
    return bool(idle_s) and not lab.playing and now - lab.last_active > idle_s


_sweeper: threading.Thread | None = None
_sweeper_lock = threading.Lock()


def start_idle_sweeper(interval_s: float = 5.0, is_connected=None) -> None:
    """Once per process: a daemon thread releasing idle and disconnected labs, so memory is
    given back even when no session is active to trigger the check. Every 5 s (a look at each
    lab's clock: microseconds): a tab gone for PAGED_LAB_DISCONNECTED_SECONDS (30) is released
    within 40 s, so a class's memory is back within a minute of it leaving. Once the
    collector's thresholds are raised (``freeze_long_lived``), it also runs a full collection
    every FULL_COLLECTION_S (app/process_memory.py)."""
    global _sweeper
    if _sweeper is not None:
        return
    with _sweeper_lock:
        if _sweeper is not None:
            return

        def sweep():
            collected = time.monotonic()
            while True:
                time.sleep(interval_s)
                try:
                    release_idle_labs(is_connected=is_connected)
                except Exception:                # a bad setting must not kill the thread
                    log.exception("idle-session sweep failed")
                if process_memory.frozen() and time.monotonic() - collected >= FULL_COLLECTION_S:
                    collected = time.monotonic()
                    gc.collect()     # process_memory.GC_THRESHOLDS: cycles are freed this often
        _sweeper = threading.Thread(target=sweep, name="paged-lab-idle-sweeper", daemon=True)
        _sweeper.start()
