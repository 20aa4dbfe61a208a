"""Admitting real vLLM (the Engine choice "Real vLLM": real_vllm/page_engine.py): whether it can
run here, the server's slots (PAGED_LAB_REAL_VLLM sessions at once), a browser's other tab
handing its slot over, and, when none is free, when one frees."""
from __future__ import annotations

import time
import weakref

from app import hosting
from app.labs import all_labs

_REAL_VLLM_ENGINES: "weakref.WeakSet" = weakref.WeakSet()    # this server's, open or closed
REAL_VLLM_OFF = ("Real vLLM is off on this server: it runs vLLM inside the server process (its "
                 "own copy of the weights, seconds to start), so the operator turns it on with "
                 "PAGED_LAB_REAL_VLLM=N, the number of sessions that may run it at once (1 for "
                 "one user: PAGED_LAB_REAL_VLLM=1 streamlit run app).")


def holds_slot(engine) -> None:
    """``engine`` (a real vLLM page engine) counts against the slots until it is closed."""
    _REAL_VLLM_ENGINES.add(engine)


def real_vllm_status() -> tuple[bool, str]:
    """(usable here, one line for the sidebar): vLLM's version, or why the choice is off."""
    from real_vllm.environment import vllm_status
    usable, line = vllm_status()
    if not usable:
        return False, line
    if not hosting.real_vllm_sessions():
        return False, REAL_VLLM_OFF
    return True, line


def check_real_vllm_allowed(replacing=None, browser: str | None = None) -> None:
    """ValueError unless vLLM is usable here, the server turned the choice on, and a real-vLLM
    slot is free (``replacing``, the session's own engine, does not hold one; another tab of
    the same ``browser`` hands its slot over)."""
    from real_vllm.environment import VllmUnavailable, import_vllm, vllm_status
    usable, why = vllm_status()          # not installed: the one command that adds it
    if not usable:
        raise ValueError(f"Real vLLM cannot start here: {why}")
    limit = hosting.real_vllm_sessions()
    if not limit:
        raise ValueError(REAL_VLLM_OFF)
    try:
        import_vllm()
    except VllmUnavailable as exc:
        raise ValueError(f"Real vLLM cannot start here: {exc}") from None
    busy = [e for e in list(_REAL_VLLM_ENGINES) if not e.closed and e is not replacing]
    if len(busy) >= limit:
        holders = [lab for lab in all_labs() if lab.engine in busy]
        if hand_over_real_vllm(holders, browser):
            busy = [e for e in busy if not e.closed]
    if len(busy) >= limit:
        raise ValueError(real_vllm_busy(len(busy), limit, holders))


def hand_over_real_vllm(holders, browser: str | None) -> int:
    """Release the labs among ``holders`` shown in another tab of ``browser`` (a reloaded or
    closed tab kept the only slot for ~30 s, issue 38); a lab a script run holds right now is
    left alone. Returns how many were released."""
    if not browser:
        return 0
    released = 0
    for lab in holders:
        if lab.browser != browser or not lab._lock.acquire(blocking=False):
            continue
        try:
            if not lab.released:
                lab.release("handed over")
                released += 1
        finally:
            lab._lock.release()
    return released


def real_vllm_busy(n_busy: int, limit: int, holders, now: float | None = None) -> str:
    """Why no real-vLLM slot is free, and when one frees: a closed tab's lab is released
    PAGED_LAB_DISCONNECTED_SECONDS after the sweeper saw it go (every 5 s), an open one when
    it is closed or idle for PAGED_LAB_IDLE_MINUTES (issue 38: the message said neither)."""
    now = time.monotonic() if now is None else now
    gone = hosting.disconnected_seconds()
    waits = [max(0.0, gone - (now - lab.disconnected_since)) + 5.0 for lab in holders
             if lab.disconnected_since is not None and gone is not None]
    idle = hosting.idle_seconds()
    when = (f"a slot frees in about {min(waits):.0f} s (its tab was closed)" if waits else
            "it is held by an open tab: it frees when that tab is closed (about "
            f"{(gone or 0) + 10:.0f} s later)"
            + (f" or after {idle / 60:.0f} minutes without a click" if idle else ""))
    return (f"Real vLLM already runs in {n_busy} session(s) on this server, the most it allows "
            f"at once (PAGED_LAB_REAL_VLLM={limit}); {when}. Meanwhile choose our vLLM v1 "
            "engine (the same rules).")
