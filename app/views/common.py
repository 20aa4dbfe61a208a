"""What every view shares: the figure toolbar, drawing a figure (always through the figure
cache), "How to read this", one short line for an unexpected error, guarded callbacks, and
``Shown``: what a tab draws from."""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import streamlit as st

from engine import StepSnapshot
from engine.sched.registry import SEMANTICS

from app.figure_cache import FigureCache
from app.figures.common import for_projector
from app.scenarios import REAL_VLLM
from app.lab import Lab
from app.messages import unexpected_message
from app.turns import TURNS
from app.views.help_texts import HOW_TO_READ

log = logging.getLogger("app.page")

# the figure toolbar keeps one button: the camera, saving the figure as a PNG (for slides)
CHART = {"displaylogo": False, "modeBarButtons": [["toImage"]],
         "toImageButtonOptions": {"format": "png", "scale": 2}}


# ---- errors --------------------------------------------------------------------------------
@contextmanager
def short_errors(what: str):
    """An unexpected exception in the block is logged with its traceback and shown as one
    short st.error (no traceback, no server path); Streamlit's rerun/stop pass through."""
    try:
        yield
    except Exception as exc:
        log.exception("unexpected error while drawing %s", what)
        st.error(f"{what[0].upper()}{what[1:]} could not be drawn: {unexpected_message(exc)}")


def guarded(callback):
    """A widget callback whose unexpected exception becomes the lab's error message. It runs
    only on widget values a widget could have sent (app/views/widget_guard.py): a forged one
    is put back and named, and the callback does nothing."""
    @functools.wraps(callback)
    def run(*args, **kwargs):
        from app.views.widget_guard import check_widgets
        lab = st.session_state.get("lab")
        try:
            with lab.in_use() if lab is not None else nullcontext():
                if lab is not None and not check_widgets(lab):
                    return None
                return callback(*args, **kwargs)
        except Exception as exc:
            log.exception("unexpected error in %s", callback.__name__)
            if lab is not None:
                lab.error = unexpected_message(exc)
    return run


# ---- drawing -------------------------------------------------------------------------------
REAL_VLLM_LABEL = "Real vLLM"


def engine_label(name: str) -> str:
    """How the page names an engine ("vLLM v1"), from the engine's registry, or the real vLLM
    (app.scenarios.REAL_VLLM, the snapshots' semantics too); a name it does not know (a trace
    from elsewhere) as it is."""
    if name == REAL_VLLM:
        return REAL_VLLM_LABEL
    rules = SEMANTICS.get(name)
    return rules.label if rules is not None else name


@contextmanager
def starting(settings):
    """A spinner while real vLLM starts (seconds; the first time in a server, vLLM's import
    too); nothing for our engine, which builds at once."""
    if not settings.real_vllm:
        yield
        return
    # the others in this process go on meanwhile (app/turns.py); this lab stays held
    with st.spinner("Starting real vLLM in this server (about 2 s; the first time also "
                    "imports vLLM and compiles its sampler, about 10 s, so that no Step "
                    "waits for it)…", show_time=True), TURNS.paused():
        yield


def how_to_read(key: str) -> None:
    with st.expander("How to read this"):
        st.markdown(HOW_TO_READ[key])


def chart(cache: FigureCache, builder: Callable, *args, key: str, config: dict = CHART) -> None:
    """The Plotly figure ``builder(*args)``, built once for these inputs (app/figure_cache.py).
    Views name a builder through its module (``pool_grid.pool_figure``), so the one drawn is
    the one the module has now (a test may replace it)."""
    fig = cache.get(builder, *args)
    if st.session_state.get("w_projector"):   # the same figure, its text projector-sized
        fig = cache.get(for_projector, fig)
    st.plotly_chart(fig, key=key, config=config, theme=None)


@dataclass(frozen=True)
class Shown:
    """What a tab draws from: the lab, the snapshot shown, the one before it, the history."""
    lab: Lab
    snap: StepSnapshot
    prev: StepSnapshot | None
    snaps: list[StepSnapshot]
    decode: Callable | None

    @classmethod
    def of(cls, lab: Lab) -> "Shown":
        return cls(lab, lab.current(), lab.previous(), lab.snapshots(), lab.decode)

    def chart(self, builder: Callable, *args, key: str, how: str | None = None) -> None:
        """A figure (cached by its inputs), then its "How to read this" if ``how`` names one."""
        chart(self.lab.figures, builder, *args, key=key)
        if how is not None:
            how_to_read(how)

    def html(self, builder: Callable, *args, how: str | None = None) -> None:
        """An HTML figure (cached by its inputs), then its "How to read this"."""
        st.markdown(self.lab.figures.get(builder, *args), unsafe_allow_html=True)
        if how is not None:
            how_to_read(how)
