"""The session's lab (app.lab.Lab) and the sidebar's widgets: ``w_<name>`` holds the value of
each page setting (app/page_settings.py), ``w_scenario`` and ``w_semantics`` the scenario and
the engine choice (a registry name, or "vllm": the real vLLM, run with ``real_vllm=True`` and
the semantics of the installed vLLM's engine)."""
from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app import hosting, idle_sessions, process_memory
from app.page_settings import SETTINGS
from app.scenarios import DEFAULT_SCENARIO, REAL_VLLM, Settings, engine_choice, rules_of_choice
from app.lab import Lab
from app.widget_checks import setting_problem
from app.views import link
from app.views.common import log


def load_widgets(s: Settings) -> None:
    for row in SETTINGS:
        st.session_state[f"w_{row.name}"] = getattr(s, row.name)


def show_settings(s: Settings) -> None:
    """All sidebar widgets, scenario and engine included, show ``s`` (a lesson's settings)."""
    st.session_state.w_scenario = s.scenario
    st.session_state.w_semantics = engine_choice(s)
    load_widgets(s)


def settings_from_widgets() -> Settings:
    """The settings the sidebar's widgets hold; ValueError naming the first field whose value
    cannot run (app/widget_checks.py: vLLM's ranges, finite numbers, offered choices)."""
    ss = st.session_state
    for row in SETTINGS:
        problem = setting_problem(row, ss[f"w_{row.name}"])
        if problem:
            raise ValueError(problem)
    values = {row.name: row.read(ss[f"w_{row.name}"]) for row in SETTINGS}
    return Settings(scenario=ss.w_scenario, semantics=rules_of_choice(ss.w_semantics).name,
                    real_vllm=ss.w_semantics == REAL_VLLM, **values)


def _session_connected(session_id: str) -> bool:
    """Whether a browser is still connected to this Streamlit session (the sweeper's view)."""
    from streamlit.runtime import Runtime
    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)


def browser_id() -> str | None:
    """A digest of the token in the browser's XSRF cookie, which every tab of one browser
    shares; None without one (AppTest, XSRF protection off). The cookie is re-masked on each
    page load ("2|mask|masked token|timestamp", the version-2 format of Tornado that Streamlit
    keeps: streamlit/web/server/starlette/starlette_app_utils.py, decode_xsrf_token_string),
    so the token is unmasked first: the raw cookie differs between two tabs."""
    import hashlib
    cookie = st.context.cookies.get("_streamlit_xsrf")
    if not isinstance(cookie, str) or not cookie:  # AppTest's context is a stand-in
        return None
    parts = cookie.split("|")
    try:
        if parts[0] == "2" and len(parts) == 4:
            mask, masked = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
            token = bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked))
        else:
            token = cookie.encode()
    except ValueError:
        return None
    return hashlib.sha256(token).hexdigest()[:16]


def get_lab() -> Lab:
    if "lab" not in st.session_state:
        lab = Lab.create(DEFAULT_SCENARIO)
        ctx = get_script_run_ctx()
        lab.session_id = ctx.session_id if ctx else None
        lab.browser = browser_id()
        st.session_state.lab = lab
        show_settings(lab.settings)
        with lab.in_use():               # a link opens where the teacher is (app/views/link.py)
            link.open_from_link(lab, show_settings)
        process_memory.freeze_long_lived()        # once per process (the model is loaded now)
    lab = st.session_state.lab
    with lab.in_use():                   # touched first: the sweep below never takes this one
        try:
            hosting.apply_torch_threads()
            idle_sessions.start_idle_sweeper(is_connected=_session_connected)
            idle_sessions.release_idle_labs(is_connected=_session_connected)   # any visit also sweeps
        except ValueError as exc:        # e.g. a bad PAGED_LAB_IDLE_MINUTES
            log.error("server settings: %s", exc)
        if lab.released:                 # this session was idle: a fresh engine, and a note
            lab.revive()
            show_settings(lab.settings)  # revive may change them (real vLLM handed over)
    return lab
