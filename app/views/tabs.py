"""The tabs under the narration, in order: each a label and the function that draws it from
``Shown`` (app/views/common.py). Only the open tab is drawn (a tab change reruns the view), and
an error in one shows one short line in that tab.

A new figure is a builder in app/figures/ and one line here: a tab that is one figure is
``lambda v: v.chart(module.builder, v.snap, ..., key="fig_…", how=…)`` (``how``: a key of
app/views/help_texts.py, or None); a tab with more on it gets a module in app/views/.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import streamlit as st

from app.figures import beam_tree, text_view
from app.views import compare, events, export, memory, waste, watch
from app.views.common import Shown, short_errors


@dataclass(frozen=True)
class Tab:
    label: str
    draw: Callable[[Shown], None]


TABS: tuple[Tab, ...] = (
    Tab("Memory", memory.draw),
    Tab("Text", lambda v: v.html(text_view.text_html, v.snap, v.decode, how="text")),
    Tab("Events", events.draw),
    Tab("Tree", lambda v: v.chart(beam_tree.beam_tree_figure, v.snap, v.snaps, key="fig_tree",
                                  how="tree")),
    Tab("Waste", waste.draw),
    Tab("Compare", compare.draw),
    Tab("Watch vLLM", watch.draw),
    Tab("Export", export.draw),
)


def draw(shown: Shown) -> None:
    """The tabs; only the open one is drawn."""
    containers = st.tabs([t.label for t in TABS], key="w_tab", on_change="rerun")
    for tab, container in zip(TABS, containers):
        with container, short_errors(f"the {tab.label} tab"):
            if container.open:
                tab.draw(shown)
