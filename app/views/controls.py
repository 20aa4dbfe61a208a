"""The row under the title: ⟲ Reset, Step, Run N, Play/Pause, ◀ Back, Fwd ▶, Latest ▶▶; the presenter
row (Play speed, Projector, keys); the history slider; and Play's timer (which the main view's
fragment runs on: app/views/main_view.py)."""
from __future__ import annotations

import streamlit as st

from app.lab import Lab
from app.turns import TURNS
from app.views.common import guarded, starting

PLAY_SPEEDS = (0.5, 1.0, 2.0, 3.0, 5.0)      # Play: steps per second
MOVES = ("step_btn", "back_btn", "forward_btn", "latest_btn")   # buttons that move the view


@guarded
def on_step() -> None:
    """Step (the button, →, the Compare tab's lockstep Step both); none when Reset came in the
    same run (Streamlit merges the triggers of clicks queued behind a run): Reset wins."""
    if st.session_state.get("reset_btn"):
        return
    lab = st.session_state.lab
    if lab.step():
        lab.error = None


@guarded
def _on_reset() -> None:
    lab = st.session_state.lab
    if lab.released:      # the whole-page run revives it, with its note (get_lab); a rebuild
        return            # here would also take back a real vLLM another tab was handed
    with starting(lab.settings):
        lab.apply(lab.settings)


@guarded
def _on_back() -> None:
    st.session_state.lab.back()


@guarded
def _on_forward() -> None:
    st.session_state.lab.forward()


@guarded
def _on_latest() -> None:
    lab = st.session_state.lab
    lab.show(len(lab.snapshots()) - 1)


@guarded
def _on_history() -> None:
    lab = st.session_state.lab
    if any(st.session_state.get(k) for k in MOVES):
        # a click that came with the slider's value from before the last run drew it (quick
        # clicks: the browser had not shown the new position yet): the click is what was
        # meant, the stale position would undo it
        return
    chosen = st.session_state.w_hist          # the slider's value: see history_slider
    snaps = lab.snapshots()
    if not isinstance(chosen, int) or not snaps:
        return
    base = history_base(snaps)
    position = chosen if base is None else chosen - base
    if 0 <= position < len(snaps):
        lab.show(position)


def _on_speed() -> None:
    st.session_state.lab.last_tick = 0.0


def _on_projector() -> None:
    st.rerun(scope="app")                # its style is drawn by the whole page, not this view


def draw(lab: Lab) -> None:
    """Buttons act in callbacks (before the page is drawn, so every button's state is current);
    Run N steps inline to show its progress bar; Play re-arms the fragment's timer."""
    # Step and Back carry no tooltip (their keys are in the presenter row's caption): they are
    # clicked over and over with the mouse resting on them, and Streamlit draws a tooltip
    # afresh after every rerun under a resting mouse (one session, measured once: ~0.06 s more
    # Chromium CPU per click; README "What a Step click costs").
    # one horizontal container, not 8 columns: the same row in 9 elements instead of 17, and
    # every element is resent on every Step (docs/hosting.md, "A class of 100")
    row = st.container(horizontal=True, gap="small")
    c = [row] * 8
    c[0].button("⟲ Reset", width="stretch", disabled=lab.replaying, key="reset_btn",
                on_click=_on_reset, help="rebuild the engine from the applied settings (key: r)")
    # Step walks forward through the recorded history while an older step is shown, and
    # computes a new step only at its end (Lab.step)
    c[1].button("Step", type="primary", width="stretch", disabled=lab.finished, key="step_btn",
                on_click=on_step, shortcut="Right")
    run_n = int(c[2].number_input("N", min_value=1, max_value=200, value=10, key="w_run_n",
                                  label_visibility="collapsed"))
    run = c[3].button(f"Run {run_n}", width="stretch", disabled=lab.finished, key="run_btn")
    play = c[4].button("⏸ Pause" if lab.playing else "▶ Play", width="stretch",
                       disabled=lab.finished and not lab.playing, key="play_btn",
                       shortcut="Space", help="step on its own at the Play speed (key: space)")
    c[5].button("◀ Back", width="stretch", disabled=lab.index() == 0, key="back_btn",
                on_click=_on_back, shortcut="Left")
    c[6].button("Fwd ▶", width="stretch", key="forward_btn", on_click=_on_forward,
                disabled=lab.at_latest, help="one recorded step forward (never a new step)")
    c[7].button("Latest ▶▶", width="stretch", key="latest_btn", on_click=_on_latest,
                disabled=lab.at_latest)
    if run:
        bar = st.progress(0.0, text=f"running {run_n} steps…")
        for i in range(run_n):
            if not lab.step():
                break
            bar.progress((i + 1) / run_n, text=f"step {i + 1}/{run_n}")
            TURNS.pass_turn()            # the others in this process wait one step, not N
        lab.error = None
        st.rerun(scope="app")            # redraw with the buttons' new state
    if play:
        lab.playing = not lab.playing
        lab.last_tick = 0.0
        st.rerun(scope="app")            # (re)arms or stops the auto-step timer


def play_interval() -> float:
    """Seconds between Play's steps, from the Play speed setting (steps per second)."""
    return 1.0 / float(st.session_state.get("w_speed", 1.0))


def play_timer() -> float | None:
    """The main view's timer Play needs now: seconds between steps while playing, else None."""
    lab = st.session_state.get("lab")
    return play_interval() if lab is not None and lab.playing else None


def presenter_row(lab: Lab) -> None:
    """Play speed, the Projector toggle and the keys; in the projector layout (no sidebar) the
    lesson picker is here too, so a class changes lessons without leaving it."""
    st.session_state.setdefault("w_speed", 1.0)
    projector = bool(st.session_state.get("w_projector"))
    # one horizontal container, not 3 columns: 4 elements instead of 7, resent on every Step
    row = st.container(horizontal=True, gap="medium", vertical_alignment="center")
    row.select_slider("Play speed (steps per second)", options=PLAY_SPEEDS, key="w_speed",
                      on_change=_on_speed, width="stretch",
                      label_visibility="collapsed" if projector else "visible",
                      help="how fast Play steps; the timer restarts at the new speed")
    row.toggle("Projector", key="w_projector", on_change=_on_projector, width="content",
               help="hides the sidebar, puts the narration beside the figures and enlarges all "
                    "text, figures included, for a 1280×720 projector; keys: → step, ← back, "
                    "space play/pause, r reset")
    if projector:
        projector_lesson_choice(row)
    else:
        row.caption("Keys: **→** step · **←** back · **space** play/pause · **r** reset",
                    width="stretch")


EXPLORE = ""                             # the projector's lesson choice: no lesson
# Set by a callback of the main view (a fragment) that changed the sidebar's widgets: the main
# view then reruns the whole page, so the browser gets their new values. Otherwise the browser
# sends its old values with the next click and the sidebar's callbacks undo the change.
FULL_RERUN = "full_rerun_needed"


def projector_lesson_choice(container) -> None:
    """The sidebar's Mode + Lesson, as one choice (the sidebar is hidden in the projector)."""
    from app.lessons import LESSONS
    ss = st.session_state
    current = ss.get("w_lesson") if ss.get("w_mode") == "Lessons" else EXPLORE
    ss["w_proj_lesson"] = current if current in LESSONS else EXPLORE
    container.selectbox("Lesson", [EXPLORE, *LESSONS], key="w_proj_lesson", width="stretch",
                        format_func=lambda k: "Explore (no lesson)" if k == EXPLORE
                        else f"Lesson {LESSONS[k].title}",
                        on_change=_on_projector_lesson, label_visibility="collapsed")


@guarded
def _on_projector_lesson() -> None:
    from app.views.lessons import start_lesson
    from app.views.session import show_settings
    ss = st.session_state
    chosen = ss.w_proj_lesson
    if chosen == EXPLORE:
        ss.w_mode = "Explore"
        ss[FULL_RERUN] = True
        return
    ss.w_mode, ss.w_lesson = "Lessons", chosen
    start_lesson(ss.lab, chosen, show_settings)
    ss[FULL_RERUN] = True                # the sidebar's widgets must show the lesson's settings


def history_base(snaps) -> int | None:
    """The first snapshot's step when each snapshot is the step after the one before (a live
    history, also once its oldest steps were dropped: the history slider's values are then step
    numbers), else None (its values are positions: an abort or a prefix-cache reset records a
    second snapshot with the same step number, a trace may skip steps)."""
    base = snaps[0].step
    if snaps[-1].step - base != len(snaps) - 1:
        return None
    return base if all(s.step == base + i for i, s in enumerate(snaps)) else None


def history_slider(lab: Lab) -> None:
    """The recorded history as a slider over whole numbers: its message is the same size at
    any history length (a select_slider sent one label per snapshot on every Step: 1,000
    snapshots added ~5 KB to each Step's messages; docs/hosting.md). A printf format cannot
    turn a position into a step number, so the values are the step numbers themselves when
    they follow one another (``history_base``), and positions otherwise, shown as
    "snapshot N"."""
    snaps = lab.snapshots()
    if len(snaps) < 2:
        st.caption("History: only the initial state so far.")
        return
    base = history_base(snaps)
    offset = 0 if base is None else base
    st.session_state.w_hist = offset + lab.index()
    st.slider("History (step shown)", min_value=offset, max_value=offset + len(snaps) - 1,
              step=1, key="w_hist", format="%d" if base is not None else "snapshot %d",
              on_change=_on_history, label_visibility="collapsed", width="stretch",
              help="scrub through the stored snapshots")
