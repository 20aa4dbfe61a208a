"""Every lab of this process, held weakly (a closed session's lab just goes): the idle sweeper
(app/idle_sessions.py) and the real-vLLM slots (app/real_vllm_slots.py) look through them."""
from __future__ import annotations

import weakref

_LABS: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def register(lab) -> None:
    _LABS[id(lab)] = lab


def all_labs() -> list:
    # valuerefs: a C-level copy, safe while another session's thread adds a lab
    return [lab for lab in (ref() for ref in _LABS.valuerefs()) if lab is not None]


def shown_labs() -> list:
    """The labs some Streamlit session shows."""
    return [lab for lab in all_labs() if lab.session_id is not None]
