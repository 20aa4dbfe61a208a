"""The sidebar: mode, lesson, scenario, engine, the settings form (Apply & reset), a trace to
replay. Scenario and engine apply at once (callbacks); the form applies on its button."""
from __future__ import annotations

import streamlit as st

from engine.sched.registry import SEMANTICS, semantics_of

from app import hosting, trace_io
from app.real_vllm_slots import real_vllm_status
from app.scenarios import (ENGINE_CHOICES, REAL_VLLM, REAL_VLLM_BLOCK_MULTIPLE, SCENARIOS,
                           engine_choice, preset, rules_of_choice, scenario_point,
                           under_engine)
from app.lab import Lab
from app.plain_text import plain, plain_code
from app.views import lessons
from app.views.common import engine_label, guarded, starting
from app.views.session import load_widgets, settings_from_widgets, show_settings
from app.views.settings_form import draw_settings
from app.views.widget_guard import sidebar_values_ok

RELOAD = "reload_settings_widgets"     # set by a refused Apply: show the running settings

# where a preset an engine refuses (v1: beam search) runs instead: an engine that has beams
BEAM_ENGINE = next(rules.name for rules in SEMANTICS.values() if rules.has_beam_search)


@guarded
def _on_scenario() -> None:
    lab = st.session_state.lab
    s = under_engine(preset(st.session_state.w_scenario, lab.settings.model),
                     engine_choice(lab.settings)
                     ).replace(backend=lab.settings.backend)  # a scenario keeps engine + kernels
    with starting(s):
        applied = lab.apply(s)
    if not applied and not semantics_of(s.semantics).has_beam_search:
        # this engine refuses the preset (v1: beam search): run it under v0 and say why
        reason = lab.error
        s = under_engine(s, BEAM_ENGINE)
        if lab.apply(s):
            st.session_state.w_semantics = BEAM_ENGINE
            lab.notice = f"This scenario runs under {semantics_of(BEAM_ENGINE).label}: {reason}"
    load_widgets(s)


@guarded
def _on_semantics() -> None:
    switch_engine(st.session_state.w_semantics)


def switch_engine(chosen: str) -> None:
    """Run the applied settings under the Engine choice ``chosen``; if that engine refuses
    them, the old engine stays (and the choice shows it) with the reason."""
    lab = st.session_state.lab
    st.session_state.w_semantics = chosen
    before = lab.settings
    s = under_engine(before, chosen)             # the applied settings, under the other engine
    with starting(s):
        applied = lab.apply(s)
    if applied:
        load_widgets(s)
        if chosen == REAL_VLLM and s.block_size != before.block_size:
            lab.notice = (f"Real vLLM's CPU attention takes blocks of a multiple of "
                          f"{REAL_VLLM_BLOCK_MULTIPLE} tokens, so this scenario's real-vLLM "
                          f"preset is loaded: {s.block_size}-token blocks and longer prompts "
                          "make the same point.")
    else:                                # e.g. v1 refuses beam search: keep the old engine
        st.session_state.w_semantics = engine_choice(lab.settings)


@guarded
def _on_trace_upload() -> None:
    lab = st.session_state.lab
    f = st.session_state.w_trace
    if f is None:
        return
    try:
        snapshots = trace_io.load_trace(f.getvalue(),
                                        max_bytes=st.get_option("server.maxUploadSize") * 1024 * 1024)
    except ValueError as exc:            # names the problem (size, JSON, the first bad field)
        lab.error = f"could not load {f.name}: {exc}"
        return
    lab.load_trace(snapshots, f.name)


def model_field(lab: Lab) -> bool:
    """A choice among the operator's models (PAGED_LAB_MODELS); free text only with ``*``.
    A value set around the field (session state, or a list that shrank) is refused with the
    message, the field goes back to the running model, and False says: do not apply."""
    allowed = hosting.allowed_models()
    if allowed is None:
        st.text_input("Model", key="w_model",
                      help="'default' (the embedded model), a local Hugging Face folder, or a "
                           "hub id (needs a network)")
        return True
    ok = True
    asked = st.session_state.get("w_model")
    if asked is not None and asked not in allowed:
        try:
            st.session_state.w_model = hosting.check_model_allowed(asked)
        except ValueError as exc:
            lab.error, ok = str(exc), False
            st.session_state.w_model = (lab.settings.model if lab.settings.model in allowed
                                        else allowed[0])
    st.selectbox("Model", allowed, key="w_model",
                 help="the models this server offers: 'default' is the embedded model; the "
                      "server's operator lists others in PAGED_LAB_MODELS")
    return ok


def real_vllm_caption(lab: Lab) -> None:
    """Under the Engine choice: which real vLLM runs (and how long it took to start), or why
    the choice is off here and the one step that turns it on."""
    engine = lab.engine
    if engine is not None and engine.is_real_vllm:
        st.caption(f"Real vLLM: {engine.version}, stepped in this server (started in "
                   f"{engine.startup_s:.1f} s); our vLLM v1 runs the same requests beside it: "
                   "see the Compare tab.")
        return
    usable, line = real_vllm_status()
    st.caption(f"Real vLLM: {line} (in this server)" if usable else
               line if line.startswith("Real vLLM") else f"Real vLLM is not available: {line}")


def settings_panel(lab: Lab, values_ok: bool = True) -> None:
    """Scenario, engine and the settings form (Apply & reset), showing the running engine's
    settings: a refused Apply puts them back (the error names what was refused). With
    ``values_ok`` False a value was put back this run (app/views/widget_guard.py): Apply then
    applies nothing, its message stays."""
    st.selectbox("Scenario", list(SCENARIOS), format_func=lambda k: SCENARIOS[k].label,
                 key="w_scenario", on_change=_on_scenario)
    st.caption(scenario_point(st.session_state.w_scenario, st.session_state.w_semantics))
    st.radio("Engine", list(ENGINE_CHOICES), format_func=engine_label,
             key="w_semantics", horizontal=True, on_change=_on_semantics,
             help="vLLM v0: separate prefill and decode steps, fork + copy-on-write for n > 1 "
                  "and beams, swap or recompute. vLLM v1: one token budget per step "
                  "(chunked prefill), n > 1 as child requests sharing the prompt through the "
                  "prefix cache, recompute-only preemption, block 0 as the null block. "
                  "Real vLLM: the installed vLLM itself (v1), stepped in this server, every "
                  "figure drawn from its own state; our v1 runs the same requests beside it "
                  "(Compare tab). No beam search and no swap there, as in our v1.")
    real_vllm_caption(lab)
    rules = rules_of_choice(st.session_state.w_semantics)
    with st.form("settings", border=False):
        model_ok = draw_settings(rules, {"model": lambda row: model_field(lab)})
        if st.form_submit_button("Apply & reset", type="primary", width="stretch") \
                and model_ok and values_ok:
            try:
                chosen = settings_from_widgets()
            except ValueError as exc:    # a value vLLM would refuse (seed -1, inf): named
                lab.error = str(exc)
                st.session_state[RELOAD] = True
                st.rerun()
            with starting(chosen):
                applied = lab.apply(chosen)
            if not applied:              # the sidebar shows what runs, not what was refused
                st.session_state[RELOAD] = True
                st.rerun()


def replay_facts(lab: Lab) -> None:
    """While a trace replays, what it is (read from its snapshots), not the live settings."""
    first = lab.trace[0]
    st.info(f"Replaying **{plain(lab.trace_name)}**: {len(lab.trace)} snapshots (steps "
            f"{first.step}–{lab.trace[-1].step}) of {plain(engine_label(first.semantics))}, "
            f"model {plain_code(first.model)}, block size {first.block_size}, {first.stats.total_blocks} "
            "blocks. The live engine's settings come back with *Back to the live engine*.")


def draw(lab: Lab) -> None:
    values_ok = sidebar_values_ok(lab)   # before any widget reads its value (issue 45)
    if st.session_state.pop(RELOAD, False) or "w_scenario" not in st.session_state:
        # before the widgets: they show the running settings (also after a replay, which
        # hides them, so Streamlit dropped their values)
        show_settings(lab.settings)
    with st.sidebar:
        st.title("PagedAttention Lab")
        st.radio("Mode", ["Explore", "Lessons"], key="w_mode", horizontal=True,
                 help="Lessons walk you through a scenario: Next steps the engine to the moment "
                      "the text describes, then asks a question about what you see.")
        if st.session_state.w_mode == "Lessons":
            lessons.lesson_picker(lab, show_settings)
        if lab.replaying:
            replay_facts(lab)
        else:
            settings_panel(lab, values_ok)
        st.divider()
        st.file_uploader("Replay a saved trace (.json.gz or .json)", type=["gz", "json"],
                         key="w_trace",
                         on_change=_on_trace_upload)
        if lab.replaying and st.button("Back to the live engine", width="stretch"):
            lab.close_trace()
            st.rerun()                   # the settings panel above is drawn for the live engine
        st.caption("Weights load once per server and are shared; this browser tab has its own "
                   "engine, KV pool and history.")
