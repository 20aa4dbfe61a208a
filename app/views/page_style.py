"""The page's own CSS and JavaScript, in one place (the files in app/views/assets/, read once).

- page.css: spacing, metric sizes, a visible keyboard focus (accessibility);
- projector.css: the projector layout (toggle or ``?projector=1``): no sidebar, larger type;
- keys.js: ``r`` presses ⟲ Reset (→ / ← / space are the buttons' own shortcuts);
- step_queue.js: quick Step clicks are never merged away (see the file's header).
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

ASSETS = Path(__file__).resolve().parent / "assets"


def _read(name: str, tag: str) -> str:
    return f"<{tag}>\n{(ASSETS / name).read_text(encoding='utf-8')}</{tag}>"


CSS = _read("page.css", "style")
PROJECTOR_CSS = _read("projector.css", "style")
KEYS_JS = _read("keys.js", "script")
STEP_QUEUE_JS = _read("step_queue.js", "script")


def apply() -> None:
    """Page config, styles and scripts: the first thing every whole-page run draws."""
    st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide",
                       initial_sidebar_state="expanded")
    st.markdown(CSS, unsafe_allow_html=True)
    if st.query_params.get("projector") == "1" and "w_projector" not in st.session_state:
        st.session_state.w_projector = True      # ?projector=1 opens in the projector layout
    if st.session_state.get("w_projector"):
        st.markdown(PROJECTOR_CSS, unsafe_allow_html=True)
    st.html(KEYS_JS, unsafe_allow_javascript=True)
    st.html(STEP_QUEUE_JS, unsafe_allow_javascript=True)
