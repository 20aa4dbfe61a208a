"""The Lessons mode on the page: pick a lesson, press Next, answer from what you see.

The lesson data and its runner live in app/lessons.py (no Streamlit there); this file only
draws them and keeps one ``LessonRun`` per session, tied to the engine it runs on: when the
student changes the settings (a new engine), the lesson starts again from its first checkpoint.
"""
from __future__ import annotations

import streamlit as st

from app.lessons import LESSONS, LessonRun
from app.scenarios import preset, under_engine


def lesson_settings(lab, key: str):
    """The lesson's preset under its engine (with what that engine fixes), on the lab's model
    and kernels."""
    lesson = LESSONS[key]
    return under_engine(preset(lesson.scenario, lab.settings.model)
                        .replace(backend=lab.settings.backend), lesson.semantics)


def start_lesson(lab, key: str, show_settings=None) -> bool:
    """Build the lesson's engine and a fresh run; False (lab.error says why) if it failed.
    ``show_settings(settings)`` puts the lesson's settings into the sidebar's widgets."""
    s = lesson_settings(lab, key)
    if not lab.apply(s):
        return False
    if show_settings is not None:
        show_settings(s)
    st.session_state.lesson_run = LessonRun(LESSONS[key])
    st.session_state.lesson_engine = lab.engine
    return True


def current_run(lab) -> LessonRun | None:
    run = st.session_state.get("lesson_run")
    if run is not None and st.session_state.get("lesson_engine") is not lab.engine:
        # new settings (e.g. an edited prompt) made a new engine: the lesson starts over on it
        run = st.session_state.lesson_run = LessonRun(run.lesson)
        st.session_state.lesson_engine = lab.engine
    return run


def _on_next() -> None:
    lab = st.session_state.lab
    with lab.in_use():                   # steps the engine: the sweeper must wait
        run = current_run(lab)
        if run is not None:
            run.next(lab)
            # set, not popped: a popped key leaves the browser's box showing the old answer,
            # which it sends back with the next click (issue 38, finding 1)
            st.session_state.w_lesson_answer = ""
            st.session_state.w_lesson_reveal = False


def _on_check() -> None:
    run = current_run(st.session_state.lab)
    if run is not None:
        run.check(st.session_state.get("w_lesson_answer", ""))


def lesson_panel(lab) -> None:
    """What to watch, Next (steps the engine to the moment), the question and its check."""
    run = current_run(lab)
    if run is None:
        st.info("Choose a lesson in the sidebar.")
        return
    lesson, n = run.lesson, len(run.lesson.checkpoints)
    with st.container(border=True):
        st.markdown(f"**Lesson {lesson.title}** — checkpoint {run.index + 1} of {n}"
                    if run.index >= 0 else f"**Lesson {lesson.title}** — {n} checkpoints")
        cp = run.checkpoint
        if cp is not None:
            st.markdown(f"**At step {run.reached.step}:** {cp.text}")
        nxt = run.next_checkpoint
        narrow = bool(st.session_state.get("w_projector"))   # a column beside the figures
        cols = [st.container(), st.container()] if narrow else st.columns([2, 3])
        if nxt is not None:
            cols[0].button(f"Next: {nxt.until_label} ▶", key="lesson_next", type="primary",
                           on_click=_on_next, width="stretch",
                           help="steps the engine until this happens")
            if cp is None:
                cols[1].caption(f"First: {nxt.text}")
        if run.missed:
            st.warning(run.missed)
        if cp is not None and cp.question is not None:
            q = cp.question
            a, b = ((st.container(), st.container()) if narrow
                    else st.columns([3, 1], vertical_alignment="bottom"))
            a.text_input(q.text, key="w_lesson_answer", placeholder="a number")
            b.button("Check", key="lesson_check", on_click=_on_check, width="stretch")
            if run.answered is True:
                st.success(f"Right: {run.expected()}." + (f" {q.explain}." if q.explain else ""))
            elif run.answered is False:
                st.error("Not quite: look at the figures below and try again.")
                if st.toggle("Show the answer", key="w_lesson_reveal"):
                    st.info(f"The engine's state says **{run.expected()}**."
                            + (f" {q.explain}." if q.explain else ""))
        if run.done:
            where = ("the Lesson menu above" if narrow else "the sidebar")
            st.success(f"Lesson complete. Pick another lesson in {where}, or keep exploring "
                       "this one with Step and Back.")


def lesson_picker(lab, show_settings) -> None:
    """Sidebar: choose a lesson (starts it). Drawn before the settings widgets, so it may
    still set their values."""
    keys = list(LESSONS)
    run = st.session_state.get("lesson_run")
    if "w_lesson" not in st.session_state:
        st.session_state.w_lesson = run.lesson.key if run else keys[0]

    def _on_lesson():
        start_lesson(st.session_state.lab, st.session_state.w_lesson, show_settings)

    st.selectbox("Lesson", keys, format_func=lambda k: LESSONS[k].title, key="w_lesson",
                 on_change=_on_lesson)
    if run is None:
        start_lesson(lab, st.session_state.w_lesson, show_settings)
