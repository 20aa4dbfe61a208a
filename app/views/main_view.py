"""The main view: title, controls, the lesson, the step shown, narration, metrics and the tabs.

It is a fragment, so a Step (or Play's timer) reruns only this view, not the sidebar.

Play's timer is the fragment's ``run_every``. Streamlit sets a fragment's timer only when the
whole page runs, so a fragment run that finds Play's state changed since (paused by Reset or by
new settings, finished, another speed) reruns the whole page to re-arm it: before, a new speed
kept the old pace until Play was pressed again, and a Reset during Play left the timer rerunning
the view. The fragment compares with the timer of the page run that registered it, i.e. the one
the browser got: each page run (app/streamlit_app.py, run afresh by Streamlit every time) reads
its timer once, before it draws anything, and builds its own fragment around it
(``main_fragment(timer)``); a fragment rerun calls the function that run built, with that
timer. (Kept in session state and written when a page run started, it could name a timer whose
run a newer input had stopped before the fragment was registered: a quick burst of speed
changes during Play then left the old pace running.)
"""
from __future__ import annotations

from typing import Callable

import streamlit as st

from app import narration
from app.figures import metrics
from app.scenarios import SCENARIOS
from app.lab import Lab
from app.views import controls, lessons, tabs
from app.plain_text import plain, plain_code
from app.views.common import Shown, engine_label, short_errors
from app.views.widget_guard import check_widgets


def main_fragment(timer: float | None) -> Callable[[], None]:
    """The main view as a fragment on Play's ``timer`` (seconds between steps, None: no timer),
    the one this page run read (see above)."""

    @st.fragment(run_every=timer)
    def main_area() -> None:
        lab: Lab | None = st.session_state.get("lab")
        if lab is None:                  # get_lab failed: its short error is already shown
            return
        if lab.released:                 # idle-released: get_lab (a whole-page run) revives it
            st.rerun(scope="app")
        if st.session_state.pop(controls.FULL_RERUN, False):
            st.rerun(scope="app")        # a callback here changed the sidebar's widgets
        # in use while drawn (Play's timer reruns only this fragment, so this is its activity)
        with lab.in_use(), short_errors("the lab"):
            _main_area(lab, timer)

    return main_area


def _main_area(lab: Lab, timer: float | None) -> None:
    check_widgets(lab)                   # a fragment run: its widgets' values (issue 45)
    if lab.engine is None and not lab.replaying:
        if lab.error:
            st.error(plain(lab.error))
        st.info("No engine yet: fix the settings in the sidebar and press **Apply & reset**.")
        return
    lab.tick(controls.play_interval())
    if controls.play_timer() != timer:   # the timer the browser has (this page run's)
        st.rerun(scope="app")            # Play's state changed: re-arm the timer (above)
    # a trace's name and fields are the visitor's: shown as text (app/plain_text.py)
    title = (f"Replay: {plain(lab.trace_name)}" if lab.replaying
             else SCENARIOS[lab.settings.scenario].label)
    st.subheader(title, anchor=False)
    controls.draw(lab)
    # below the button row (after the controls ran: a Step clears the error), never above it:
    # a message that appears (a refused Apply, a failed step) must not move Step from under
    # the mouse
    if lab.error:
        st.error(plain(lab.error))
    elif lab.notice:
        st.warning(plain(lab.notice))
    controls.presenter_row(lab)
    lesson = st.session_state.get("w_mode") == "Lessons" and not lab.replaying
    snap = lab.current()
    total = lab.snapshots()[-1].step
    state = ("finished" if lab.finished and not lab.replaying else
             "playing" if lab.playing else "paused")
    # a horizontal container, not 2 columns: 3 elements instead of 5, resent on every Step
    row = st.container(horizontal=True, gap="medium", vertical_alignment="center")
    row.caption(f"Step **{snap.step}** of {total} · {plain(engine_label(snap.semantics))}"
                 f" · {plain(snap.kind)} · {state} · model "
                 f"{plain_code(snap.model)} · {plain_code(snap.backend)} · block size "
                 f"{snap.block_size}",
                 width="content")             # the history slider takes the rest of the row
    with row:
        controls.history_slider(lab)
    if "failed" in snap.backend:
        st.warning(f"A Triton kernel could not run on this machine, so the torch reference ran "
                   f"that op instead (outputs are unchanged): {plain_code(snap.backend)}")
    with short_errors("this view"):
        if st.session_state.get("w_projector"):
            # the projector layout: the lesson and the narration beside the figures they talk
            # about, so at 1280x720 the figures are on the first screen
            shown = Shown.of(lab)
            left, right = st.columns([1, 2.3], gap="medium")
            with left:
                if lesson:
                    lessons.lesson_panel(lab)
                step_text(shown, compact=True)
            with right:
                tabs.draw(shown)
        else:
            if lesson:
                lessons.lesson_panel(lab)
            step_view(lab)
    st.caption(f"rendered step {snap.step}")


def step_text(shown: Shown, compact: bool = False) -> None:
    """The narration of the step shown and its metrics (one line of them when compact)."""
    st.info(narration.narrate(shown.snap, shown.prev, shown.decode))
    if compact:
        st.caption(" · ".join(f"{m.label} **{m.value}**" for m in metrics.metrics(shown.snap)))
        return
    row = st.container(horizontal=True, gap="small")    # not columns: fewer elements
    for m in metrics.metrics(shown.snap):
        row.metric(m.label, m.value, help=m.help, width="stretch")


def step_view(lab: Lab) -> None:
    """The narration of the step shown, its metrics, and the tabs."""
    shown = Shown.of(lab)
    step_text(shown)
    tabs.draw(shown)
