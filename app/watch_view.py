"""Watch a KV cache event stream (a vLLM server's, or this engine's publisher)."""
from __future__ import annotations

import streamlit as st


def watch_tab() -> None:
    st.info("Watching a vLLM server's KV cache events is being built.")
