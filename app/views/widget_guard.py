"""The edge of every run (issue 45): each widget's value is checked before a callback or a
view uses it (app/widget_checks.py). A value no widget could have sent (a scenario "nope", an
Engine "v9", a speed of 7) goes back to what runs and the page says why, in the widget's
label; the sidebar and the uploader stay. Called first in every guarded callback and before
the sidebar and the main view draw."""
from __future__ import annotations

import streamlit as st

from app.lessons import LESSONS
from app.page_settings import SETTINGS
from app.scenarios import ENGINE_CHOICES, SCENARIOS, engine_choice
from app.widget_checks import (bool_problem, choice_problem, drawable_problem,
                               number_problem, text_problem)

MODES = ("Explore", "Lessons")
PUT_BACK = "widget_values_put_back"  # since the sidebar last looked: a callback's check found one


def _choices(lab) -> dict:
    """key -> (label, allowed values, the value it goes back to)."""
    from app.views.controls import EXPLORE, PLAY_SPEEDS
    from app.views.tabs import TABS
    lesson = next(iter(LESSONS))
    return {
        "w_scenario": ("Scenario", tuple(SCENARIOS), lab.settings.scenario),
        "w_semantics": ("Engine", ENGINE_CHOICES, engine_choice(lab.settings)),
        "w_mode": ("Mode", MODES, MODES[0]),
        "w_lesson": ("Lesson", tuple(LESSONS), lesson),
        "w_proj_lesson": ("Lesson", (EXPLORE, *LESSONS), EXPLORE),
        "w_speed": ("Play speed", PLAY_SPEEDS, 1.0),
        "w_tab": ("Tab", tuple(t.label for t in TABS), TABS[0].label),
    }


def _others(value_of) -> dict:
    """key -> (the problem with its value, or None; the value it goes back to)."""
    return {
        "w_projector": (bool_problem("Projector", value_of("w_projector")), False),
        "w_lesson_reveal": (bool_problem("Show the answer", value_of("w_lesson_reveal")), False),
        "w_lesson_answer": (text_problem("The answer", value_of("w_lesson_answer"), 200), ""),
        "w_run_n": (number_problem("N (Run N)", value_of("w_run_n"), integer=True,
                                   bounds=(1, 200)), 10),
        "w_hist": (number_problem("History", value_of("w_hist"), integer=True), None),
    }


def check_widgets(lab) -> bool:
    """Every widget value in this session checked; a bad one is put back and named in
    ``lab.error`` (the first, if several). False if a value a callback reads was (a setting
    of the form is read only by Apply, which ``sidebar_values_ok`` stops)."""
    ss = st.session_state
    problems = []

    def put_back(key, problem, value) -> None:
        problems.append(problem)
        if value is None:
            del ss[key]                  # the widget draws its own value again
        else:
            ss[key] = value

    for key, (label, allowed, fallback) in _choices(lab).items():
        if key in ss:
            problem = choice_problem(label, ss[key], allowed)
            if problem:
                put_back(key, problem, fallback)
    for key, (problem, fallback) in _others(lambda k: ss.get(k)).items():
        if key in ss and problem:
            put_back(key, problem, fallback)
    callbacks_ok = not problems          # the choices callbacks read
    for row in SETTINGS:                 # read only by Apply, which PUT_BACK stops
        key = f"w_{row.name}"
        if key in ss:
            problem = drawable_problem(row, ss[key])
            if problem:
                put_back(key, problem, getattr(lab.settings, row.name))
    if problems:
        lab.error = problems[0] + "; it shows what runs again."
        ss[PUT_BACK] = True
    return callbacks_ok


def sidebar_values_ok(lab) -> bool:
    """For Apply: no value was put back in this run, by this check or a callback's before it
    (Apply would otherwise run the settings as put back, not as sent)."""
    check_widgets(lab)
    return not st.session_state.pop(PUT_BACK, False)
