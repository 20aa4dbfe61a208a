"""A link that opens the page where the teacher is: ``?scenario=…&lesson=…&checkpoint=…&step=…``
(and ``projector=1``). A student who opens the teacher's bare address got step 0 of a fresh
engine (issue 38); this link rebuilds the same run on the student's own engine, so every
number is that engine's, stepped to the same place.

Read once, when a session's lab is created (``open_from_link``); ``link_query`` is what the
Export tab shows for the view on screen. A bad value is refused in the link's own words, and
the page opens at its default instead.
"""
from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from app.lessons import LESSONS
from app.scenarios import SCENARIOS, preset

MAX_LINK_STEPS = 400                  # app.engine_build.MAX_HISTORY: a step the history still holds


def _int(value: str, name: str, top: int) -> int:
    if not value.isdigit() or int(value) > top:
        raise ValueError(f"the link's {name}={value!r} is not a whole number from 0 to {top}")
    return int(value)


def parse_link(params) -> dict:
    """The link's choices from query parameters (a mapping of str -> str); ValueError names
    the first bad one."""
    out = {}
    scenario = params.get("scenario")
    if scenario is not None:
        if scenario not in SCENARIOS:
            raise ValueError(f"the link's scenario={scenario!r} is not one of "
                             + ", ".join(SCENARIOS))
        out["scenario"] = scenario
    lesson = params.get("lesson")
    if lesson is not None:
        if lesson not in LESSONS:
            raise ValueError(f"the link's lesson={lesson!r} is not one of " + ", ".join(LESSONS))
        out["lesson"] = lesson
        cp = params.get("checkpoint")
        if cp is not None:
            out["checkpoint"] = _int(cp, "checkpoint", len(LESSONS[lesson].checkpoints))
    step = params.get("step")
    if step is not None and "lesson" not in out:
        out["step"] = _int(step, "step", MAX_LINK_STEPS)
    return out


def open_from_link(lab, show_settings) -> None:
    """Put a new session's lab where its link says (scenario, lesson and checkpoint, or step)."""
    from app.views.lessons import start_lesson
    try:
        chosen = parse_link(st.query_params)
    except ValueError as exc:
        lab.error = f"{exc}; the page opened at its start instead."
        return
    if "lesson" in chosen:
        st.session_state.w_mode, st.session_state.w_lesson = "Lessons", chosen["lesson"]
        if start_lesson(lab, chosen["lesson"], show_settings):
            run = st.session_state.lesson_run
            for _ in range(chosen.get("checkpoint", 0)):
                if not run.next(lab):
                    break
        return
    if "scenario" in chosen and chosen["scenario"] != lab.settings.scenario:
        if not lab.apply(preset(chosen["scenario"], lab.settings.model)
                         .replace(backend=lab.settings.backend)):
            return
        show_settings(lab.settings)
    for _ in range(chosen.get("step", 0)):
        if not lab.step():
            break


def link_query(lab) -> str:
    """The query string of the view on screen: its scenario and step, or its lesson and
    checkpoint; the projector too when it is on."""
    ss = st.session_state
    run = ss.get("lesson_run") if ss.get("w_mode") == "Lessons" else None
    if run is not None:
        q = {"lesson": run.lesson.key, "checkpoint": max(0, run.index + 1)}
    else:
        q = {"scenario": lab.settings.scenario, "step": lab.current().step}
    if ss.get("w_projector"):
        q["projector"] = 1
    return "?" + urlencode(q)


def base_url() -> str:
    """The page's address as the browser opened it, without its query ("" when unknown)."""
    url = st.context.url or ""
    return url.split("?", 1)[0]
