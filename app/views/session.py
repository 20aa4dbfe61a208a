"""The session's lab (app.state.Lab) and the sidebar's widgets: ``w_<field>`` holds the value
of each Settings field, ``w_scenario`` and ``w_semantics`` the scenario and the engine choice
("v0", "v1", or "vllm": the real vLLM, ``Settings(semantics="v1", real_vllm=True)``)."""
from __future__ import annotations

from dataclasses import fields

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app import hosting, state
from app.scenarios import DEFAULT_SCENARIO, REAL_VLLM, Settings, engine_choice
from app.state import Lab
from app.views import link
from app.views.common import log

FIELDS = [f.name for f in fields(Settings) if f.name not in ("scenario", "semantics", "real_vllm")]
_INTEGERS = ("n", "top_k", "max_tokens", "beam_width", "seed", "block_size", "num_gpu_blocks",
             "num_cpu_blocks", "max_model_len", "max_num_batched_tokens")


def load_widgets(s: Settings) -> None:
    for name in FIELDS:
        st.session_state[f"w_{name}"] = getattr(s, name)


def show_settings(s: Settings) -> None:
    """All sidebar widgets, scenario and engine included, show ``s`` (a lesson's settings)."""
    st.session_state.w_scenario = s.scenario
    st.session_state.w_semantics = engine_choice(s)
    load_widgets(s)


def settings_from_widgets() -> Settings:
    ss = st.session_state
    values = {name: ss[f"w_{name}"] for name in FIELDS}
    for name in _INTEGERS:
        v = values[name]
        values[name] = int(v) if isinstance(v, float) and v.is_integer() else v
    if values.get("max_model_len") in (0, None):
        values["max_model_len"] = None       # 0 (or an empty field): the model's context
    real = ss.w_semantics == REAL_VLLM
    return Settings(scenario=ss.w_scenario, semantics="v1" if real else ss.w_semantics,
                    real_vllm=real, **values)


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
        state.freeze_long_lived()        # once per process (the model is loaded now)
    lab = st.session_state.lab
    with lab.in_use():                   # touched first: the sweep below never takes this one
        try:
            hosting.apply_torch_threads()
            state.start_idle_sweeper(is_connected=_session_connected)
            state.release_idle_labs(is_connected=_session_connected)   # any visit also sweeps
        except ValueError as exc:        # e.g. a bad PAGED_LAB_IDLE_MINUTES
            log.error("server settings: %s", exc)
        if lab.released:                 # this session was idle: a fresh engine, and a note
            lab.revive()
            show_settings(lab.settings)  # revive may change them (real vLLM handed over)
    return lab
