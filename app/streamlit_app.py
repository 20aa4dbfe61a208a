"""PagedAttention Lab — the page (`streamlit run app`).

Layout only: the session's engine lives in app.state.Lab, presets in app.scenarios, every figure
is a pure function in app.figures.*, the narration in app.narration, traces in app.trace_io.
The page draws only from snapshots, their events and public Engine methods.
Hosted for a class (app.hosting): the Model field offers only the operator's models, uploads
are bounded, idle sessions are released, and no exception shows a traceback or a server path:
callbacks and views catch what they did not expect, log it, and show one short line.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # `streamlit run app` puts only app/ on the path
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402
from streamlit.runtime.scriptrunner import get_script_run_ctx  # noqa: E402

from app.figures.beam_tree import beam_tree_figure  # noqa: E402
from app.figures.block_tables import block_table_figure  # noqa: E402
from app.figures.cow import cow_figure, cow_rows  # noqa: E402
from app.figures.metrics import metrics  # noqa: E402
from app.figures.pool_grid import pool_figure  # noqa: E402
from app.figures.text_view import text_html  # noqa: E402
from app.figures.timeline import timeline_figure  # noqa: E402
from app.figures.address_space import address_space_figure  # noqa: E402
from app.watch_view import watch_tab  # noqa: E402
from app.figures.waste import (block_size_sweep_figure, request_table, waste_figure,  # noqa: E402
                               waste_headline)
from app.narration import narrate  # noqa: E402
from app.compare import compare_table  # noqa: E402
from app.figures.slides import slides_html  # noqa: E402
from app.lesson_view import lesson_panel, lesson_picker  # noqa: E402
from app.step_queue import STEP_QUEUE_JS  # noqa: E402
from app.scenarios import COMPARE_NOTES, DEFAULT_SCENARIO, SCENARIOS, Settings, preset  # noqa: E402
from app import hosting  # noqa: E402
from app.state import Lab, release_idle_labs, start_idle_sweeper, unexpected_message  # noqa: E402
from app.trace_io import load_trace, metrics_csv, trace_json  # noqa: E402

log = logging.getLogger("app.page")

PLAY_SPEEDS = (0.5, 1.0, 2.0, 3.0, 5.0)      # Play: steps per second
FIELDS = [f.name for f in fields(Settings) if f.name not in ("scenario", "semantics")]
ENGINES = {"v0": "vLLM v0", "v1": "vLLM v1"}
# the figure toolbar keeps one button: the camera, saving the figure as a PNG (for slides)
CHART = {"displaylogo": False, "modeBarButtons": [["toImage"]],
         "toImageButtonOptions": {"format": "png", "scale": 2}}
TABS = ["Memory", "Text", "Events", "Tree", "Waste", "Compare", "Watch vLLM", "Export"]
CSS = """<style>
[data-testid="stMainBlockContainer"] {padding-top: 2.6rem; padding-bottom: 1rem;}
[data-testid="stSidebarHeader"] {display: none;}
[data-testid="stMetricValue"] {font-size: 1.45rem;}
[data-testid="stMetricLabel"] p {font-size: 0.95rem;}
h3 {padding-top: 0.2rem;}
/* keyboard focus is always visible (accessibility) */
:focus-visible {outline: 3px solid #0072B2 !important; outline-offset: 2px;}
</style>"""
# projector layout: no sidebar, larger type, tighter spacing (1280x720)
PROJECTOR_CSS = """<style>
section[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"] {display: none;}
html, [data-testid="stMainBlockContainer"] {font-size: 19px;}
[data-testid="stMainBlockContainer"] {padding: 1rem 1.2rem; max-width: 100%;}
[data-testid="stMetricValue"] {font-size: 1.7rem;}
[data-testid="stAlertContainer"] p {font-size: 1.15rem;}
</style>"""
# "r" resets (Streamlit reserves R for its own rerun, so button shortcuts cannot take it);
# → / ← / space are the Step / Back / Play buttons' own shortcuts
KEYS_JS = """<script>
if (!window.__pagedLabKeys) {
  window.__pagedLabKeys = true;
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (e.key !== "r" && e.key !== "R")) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const reset = [...document.querySelectorAll("button")].find(
      (b) => b.innerText.trim().startsWith("⟲ Reset"));
    if (reset && !reset.disabled) {
      e.preventDefault(); e.stopImmediatePropagation(); reset.click();
    }
  }, true);
}
</script>"""

HOW_TO_READ = {
    "tables": "Each row is a live sequence; column *Lk* is its k-th logical block (tokens "
              "k·B … k·B+B−1). The cell names the **physical** block holding them: `P7 ×3` means "
              "block 7 of the pool, referenced by 3 tables (shared: orange). Blue = owned alone. "
              "Swapped sequences point into the CPU pool (`C3`, purple). Hover for the tokens.",
    "pool": "Every physical block of the pool, in id order. Grey = free, blue = used by one "
            "table, orange = shared (refcount > 1), green = free but still cached for prefix "
            "reuse, purple = CPU swap pool. A cell shows `rc` (refcount) and fill "
            "(filled/slots). Red arrows are this step's copy-on-write copies (shared source → "
            "private copy); purple arrows are swaps. Hover a cell for the tokens it holds.",
    "cow": "Before a sequence writes into a block that others also reference, the engine gives it "
           "a new block and copies the K/V there (copy-on-write). Full blocks are never written "
           "again, so they stay shared; only a partly filled shared block is copied, and the last "
           "sharer writes in place.",
    "text": "Each sequence's tokens, grouped by logical block: a band per block, labelled with the "
            "physical block (P…) that holds its K/V. Grey = prompt, black = generated. "
            "`·` is a space, `↵` a newline.",
    "timeline": "One lane per event kind; a dot per step, with the number of events of that kind. "
                "The shaded band marks the step shown. `append` = a token's K/V written into a "
                "block slot, `fork` = block table copied (refcounts +1), `cow` = a shared block "
                "copied before a write, `free` = a block's refcount reached 0.",
    "tree": "One line per sequence from the step it was born to the step it ended; a grey "
            "diagonal joins a forked child to its parent. Beam search keeps the best *width* "
            "candidates each step, scored as transformers' `generate(num_beams=...)` scores them "
            "(length_penalty, early_stopping); memory follows vLLM v0: survivors fork, pruned "
            "beams (dashed, ×) free their blocks, finished hypotheses end in a star.",
    "waste": "The same requests replayed on contiguous allocators (vLLM paper, Fig. 2): **Max** "
             "reserves the model's whole context per sequence, **Pow2** the next power of two ≥ "
             "prompt+output, **Oracle** exactly prompt+output. Slots are token states (hold a "
             "token now), reserved (will later), internal fragmentation (never will), external "
             "fragmentation (free but unusable), free. A request whose reservation does not fit "
             "waits (right); with Max in a small pool a request may never fit (marked *N never "
             "fit*: counted as rejected, not waiting). The paged "
             "pool's only waste is the slack in each sequence's last block.",
}


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
    """A widget callback whose unexpected exception becomes the lab's error message."""
    @functools.wraps(callback)
    def run(*args, **kwargs):
        lab = st.session_state.get("lab")
        try:
            with lab.in_use() if lab is not None else nullcontext():
                return callback(*args, **kwargs)
        except Exception as exc:
            log.exception("unexpected error in %s", callback.__name__)
            if lab is not None:
                lab.error = unexpected_message(exc)
    return run


# ---- session -------------------------------------------------------------------------------
def _load_widgets(s: Settings) -> None:
    for name in FIELDS:
        st.session_state[f"w_{name}"] = getattr(s, name)


def _show_settings(s: Settings) -> None:
    """All sidebar widgets, scenario and engine included, show ``s`` (a lesson's settings)."""
    st.session_state.w_scenario = s.scenario
    st.session_state.w_semantics = s.semantics
    _load_widgets(s)


def _session_connected(session_id: str) -> bool:
    """Whether a browser is still connected to this Streamlit session (the sweeper's view)."""
    from streamlit.runtime import Runtime
    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)


def get_lab() -> Lab:
    if "lab" not in st.session_state:
        lab = Lab.create(DEFAULT_SCENARIO)
        ctx = get_script_run_ctx()
        lab.session_id = ctx.session_id if ctx else None
        st.session_state.lab = lab
        st.session_state.w_scenario = lab.settings.scenario
        st.session_state.w_semantics = lab.settings.semantics
        _load_widgets(lab.settings)
    lab = st.session_state.lab
    with lab.in_use():                   # touched first: the sweep below never takes this one
        try:
            hosting.apply_torch_threads()
            start_idle_sweeper(is_connected=_session_connected)
            release_idle_labs(is_connected=_session_connected)   # any visit also sweeps
        except ValueError as exc:        # e.g. a bad PAGED_LAB_IDLE_MINUTES
            log.error("server settings: %s", exc)
        if lab.released:                 # this session was idle: a fresh engine, and a note
            lab.revive()
    return lab


def _for_engine(s: Settings, semantics: str) -> Settings:
    """Settings under the chosen engine: v1 caches prefixes by default and has no swap; back
    in v0, prefix caching is what the scenario's preset says."""
    if semantics == "v1":
        return s.replace(semantics="v1", enable_prefix_caching=True, preemption_mode="recompute")
    return s.replace(semantics="v0",
                     enable_prefix_caching=SCENARIOS[s.scenario].settings.enable_prefix_caching)


@guarded
def _on_scenario() -> None:
    lab = st.session_state.lab
    s = _for_engine(preset(st.session_state.w_scenario, lab.settings.model), lab.settings.semantics
                    ).replace(backend=lab.settings.backend)  # a scenario keeps engine + kernels
    if not lab.apply(s) and s.semantics == "v1":
        # v1 refuses this preset (beam search): run it under v0 and say why
        reason = lab.error
        s = _for_engine(s, "v0")
        if lab.apply(s):
            st.session_state.w_semantics = "v0"
            lab.notice = f"This scenario runs under vLLM v0: {reason}"
    _load_widgets(s)


@guarded
def _on_semantics() -> None:
    lab = st.session_state.lab
    chosen = st.session_state.w_semantics
    s = _for_engine(lab.settings, chosen)        # the applied settings, under the other engine
    if lab.apply(s):
        _load_widgets(s)
    else:                                # e.g. v1 refuses beam search: keep the old engine
        st.session_state.w_semantics = lab.settings.semantics


def _settings_from_widgets() -> Settings:
    ss = st.session_state
    values = {name: ss[f"w_{name}"] for name in FIELDS}
    for name in ("n", "top_k", "max_tokens", "beam_width", "seed", "block_size",
                 "num_gpu_blocks", "num_cpu_blocks", "max_model_len", "max_num_batched_tokens"):
        v = values[name]
        values[name] = int(v) if isinstance(v, float) and v.is_integer() else v
    return Settings(scenario=ss.w_scenario, semantics=ss.w_semantics, **values)


@guarded
def _on_trace_upload() -> None:
    lab = st.session_state.lab
    f = st.session_state.w_trace
    if f is None:
        return
    try:
        snapshots = load_trace(f.getvalue(),
                               max_bytes=st.get_option("server.maxUploadSize") * 1024 * 1024)
    except ValueError as exc:            # names the problem (size, JSON, the first bad field)
        lab.error = f"could not load {f.name}: {exc}"
        return
    lab.load_trace(snapshots, f.name)


@guarded
def _on_history() -> None:
    lab = st.session_state.lab
    chosen = st.session_state.w_hist          # a position in the history, not a step number
    if isinstance(chosen, int) and 0 <= chosen < len(lab.snapshots()):
        lab.show(chosen)


# ---- sidebar -------------------------------------------------------------------------------
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


def sidebar(lab: Lab) -> None:
    with st.sidebar:
        st.title("PagedAttention Lab")
        st.radio("Mode", ["Explore", "Lessons"], key="w_mode", horizontal=True,
                 help="Lessons walk you through a scenario: Next steps the engine to the moment "
                      "the text describes, then asks a question about what you see.")
        if st.session_state.w_mode == "Lessons":
            lesson_picker(lab, _show_settings)
        st.selectbox("Scenario", list(SCENARIOS), format_func=lambda k: SCENARIOS[k].label,
                     key="w_scenario", on_change=_on_scenario)
        st.caption(SCENARIOS[st.session_state.w_scenario].point)
        st.radio("Engine", list(ENGINES), format_func=ENGINES.get, key="w_semantics",
                 horizontal=True, on_change=_on_semantics,
                 help="vLLM v0: separate prefill and decode steps, fork + copy-on-write for n > 1 "
                      "and beams, swap or recompute. vLLM v1: one token budget per step "
                      "(chunked prefill), n > 1 as child requests sharing the prompt through the "
                      "prefix cache, recompute-only preemption, block 0 as the null block.")
        v1 = st.session_state.w_semantics == "v1"
        with st.form("settings", border=False):
            model_ok = model_field(lab)
            st.text_area("Prompts (one request per line)", key="w_prompts", height=110)
            a, b = st.columns(2)
            a.number_input("n (samples)", key="w_n", step=1)
            b.number_input("beam width", key="w_beam_width", step=1,
                           help="> 1 = beam search: transformers' scoring, vLLM v0's memory rules "
                                "(survivors fork, pruned beams free blocks); needs temperature 0")
            a.number_input("temperature", key="w_temperature", step=0.1, format="%.2f")
            b.number_input("max tokens", key="w_max_tokens", step=1)
            a.number_input("block size", key="w_block_size", step=1,
                           help="tokens per KV block: a power of two")
            b.number_input("seed", key="w_seed", step=1)
            a.number_input("GPU pool (blocks)", key="w_num_gpu_blocks", step=1)
            b.number_input("CPU pool (blocks)", key="w_num_cpu_blocks", step=1,
                           help="swap space; 0 disables swapping")
            st.number_input("max_model_len (slots per sequence)", key="w_max_model_len", step=1,
                            help="the slab a contiguous allocator reserves for every sequence: "
                                 "the longest prompt + output a sequence may reach (vLLM's "
                                 "max_model_len). Empty = the model's context.")
            st.radio("Preemption", ["recompute", "swap"], key="w_preemption_mode", horizontal=True,
                     disabled=v1, help="vLLM v1 preempts by recompute only (it has no swap)"
                     if v1 else "what happens to a preempted sequence's blocks")
            st.checkbox("Prefix caching", key="w_enable_prefix_caching",
                        help="on by default in vLLM v1, off in v0")
            st.number_input("token budget per step (v1)", key="w_max_num_batched_tokens", step=1,
                            disabled=not v1,
                            help="vLLM v1's max_num_batched_tokens: the tokens one step may "
                                 "compute; a longer prompt is computed in chunks (chunked "
                                 "prefill). v0 computes whole prompts in a prefill step.")
            with st.expander("More sampling settings"):
                st.number_input("top-p", key="w_top_p", step=0.05, format="%.2f",
                                help="sampling only: beam search ranks every token, so with "
                                     "beam width > 1 it is not used")
                st.number_input("top-k (-1 = off)", key="w_top_k", step=1,
                                help="sampling only: not used with beam width > 1")
                st.number_input("length penalty (beams)", key="w_length_penalty", step=0.1,
                                format="%.2f", help="beam search only: not used with beam "
                                                    "width 1")
                st.checkbox("ignore EOS (always run to max tokens)", key="w_ignore_eos")
            with st.expander("Kernels"):
                st.selectbox("Kernel backend", ["auto", "torch", "triton", "triton-legacy"],
                             key="w_backend",
                             help="auto: Triton kernels on a CUDA GPU (an op whose kernel fails "
                                  "to compile or launch falls back to torch, and the page says "
                                  "so), torch on CPU. torch / triton force one; triton-legacy "
                                  "is the previous Triton decode/prefill. On CPU, Triton needs "
                                  "TRITON_INTERPRET=1 set before the server starts.")
            if st.form_submit_button("Apply & reset", type="primary", width="stretch") \
                    and model_ok:
                lab.apply(_settings_from_widgets())
        st.divider()
        st.file_uploader("Replay a saved trace (.json)", type=["json"], key="w_trace",
                         on_change=_on_trace_upload)
        if lab.replaying and st.button("Back to the live engine", width="stretch"):
            lab.close_trace()
        st.caption("Weights load once per server and are shared; this browser tab has its own "
                   "engine, KV pool and history.")


# ---- main area -----------------------------------------------------------------------------
@guarded
def _on_step() -> None:
    lab = st.session_state.lab
    if lab.step():
        lab.error = None


@guarded
def _on_reset() -> None:
    lab = st.session_state.lab
    lab.apply(lab.settings)


@guarded
def _on_back() -> None:
    st.session_state.lab.back()


@guarded
def _on_latest() -> None:
    lab = st.session_state.lab
    lab.show(len(lab.snapshots()) - 1)


def controls(lab: Lab) -> None:
    """Buttons act in callbacks (before the page is drawn, so every button's state is current);
    Run N steps inline to show its progress bar; Play re-arms the fragment's timer."""
    # Step and Back carry no tooltip (their keys are in the presenter row's caption): they are
    # clicked over and over with the mouse resting on them, and Streamlit draws a tooltip
    # afresh after every rerun under a resting mouse (one session, measured once: ~0.06 s more
    # Chromium CPU per click; README "What a Step click costs").
    c = st.columns([1.1, 1, 0.9, 1.2, 1.2, 1, 1.3])
    c[0].button("⟲ Reset", width="stretch", disabled=lab.replaying, key="reset_btn",
                on_click=_on_reset, help="rebuild the engine from the applied settings (key: r)")
    c[1].button("Step", type="primary", width="stretch", disabled=lab.finished, key="step_btn",
                on_click=_on_step, shortcut="Right")
    run_n = int(c[2].number_input("N", min_value=1, max_value=200, value=10, key="w_run_n",
                                  label_visibility="collapsed"))
    run = c[3].button(f"Run {run_n}", width="stretch", disabled=lab.finished, key="run_btn")
    play = c[4].button("⏸ Pause" if lab.playing else "▶ Play", width="stretch",
                       disabled=lab.finished and not lab.playing, key="play_btn",
                       shortcut="Space", help="step on its own at the Play speed (key: space)")
    c[5].button("◀ Back", width="stretch", disabled=lab.index() == 0, key="back_btn",
                on_click=_on_back, shortcut="Left")
    c[6].button("Latest ▶▶", width="stretch", key="latest_btn", on_click=_on_latest,
                disabled=lab.index() >= len(lab.snapshots()) - 1)
    if run:
        bar = st.progress(0.0, text=f"running {run_n} steps…")
        for i in range(run_n):
            if not lab.step():
                break
            bar.progress((i + 1) / run_n, text=f"step {i + 1}/{run_n}")
        lab.error = None
        st.rerun(scope="app")            # redraw with the buttons' new state
    if play:
        lab.playing = not lab.playing
        lab.last_tick = 0.0
        st.rerun(scope="app")            # (re)arms or stops the auto-step timer


def play_interval() -> float:
    """Seconds between Play's steps, from the Play speed setting (steps per second)."""
    return 1.0 / float(st.session_state.get("w_speed", 1.0))


def _play_timer() -> float | None:
    """The main view's timer Play needs now: seconds between steps while playing, else None."""
    lab = st.session_state.get("lab")
    return play_interval() if lab is not None and lab.playing else None


# The timer (``run_every``) of the main view's fragment. Streamlit sets a fragment's timer
# only when the whole page runs, so a fragment run that finds Play's state changed since
# (paused by Reset or by new settings, finished, another speed) reruns the whole page to re-arm
# it: before, a new speed kept the old pace until Play was pressed again, and a Reset during
# Play left the timer rerunning the view. The fragment compares with the timer of the page
# run that registered it, i.e. the one the browser got: Streamlit runs each page run in a new
# module, and a fragment rerun calls the function that run defined, with that run's globals.
# (Kept in session state and written when a page run started, it could name a timer whose
# run a newer input had stopped before the fragment was registered: a quick burst of speed
# changes during Play then left the old pace running.)
_MAIN_TIMER = _play_timer()


def _on_speed() -> None:
    st.session_state.lab.last_tick = 0.0


def _on_projector() -> None:
    st.rerun(scope="app")                # its style is drawn by the whole page, not this view


def presenter_row(lab: Lab) -> None:
    a, b, c = st.columns([2.2, 1.2, 3], vertical_alignment="center")
    st.session_state.setdefault("w_speed", 1.0)
    a.select_slider("Play speed (steps per second)", options=PLAY_SPEEDS, key="w_speed",
                    on_change=_on_speed,
                    help="how fast Play steps; the timer restarts at the new speed")
    b.toggle("Projector", key="w_projector", on_change=_on_projector,
             help="hides the sidebar and enlarges the type for a 1280×720 projector; keys: "
                  "→ step, ← back, space play/pause, r reset")
    c.caption("Keys: **→** step · **←** back · **space** play/pause · **r** reset")


def history_slider(lab: Lab) -> None:
    snaps = lab.snapshots()
    if len(snaps) < 2:
        st.caption("History: only the initial state so far.")
        return
    # keyed by position: an abort records a second snapshot with the same step number
    labels = [f"{s.step} (abort)" if s.kind == "abort" else str(s.step) for s in snaps]
    st.session_state.w_hist = lab.index()
    st.select_slider("History (step shown)", options=list(range(len(snaps))), key="w_hist",
                     format_func=labels.__getitem__, on_change=_on_history,
                     label_visibility="collapsed", help="scrub through the stored snapshots")


def how_to_read(key: str) -> None:
    with st.expander("How to read this"):
        st.markdown(HOW_TO_READ[key])


def views(lab: Lab) -> None:
    snaps = lab.snapshots()
    snap, prev, decode = lab.current(), lab.previous(), lab.decode
    st.info(narrate(snap, prev, decode))
    for col, m in zip(st.columns(6), metrics(snap)):
        col.metric(m.label, m.value, help=m.help)
    tabs = dict(zip(TABS, st.tabs(TABS, key="w_tab", on_change="rerun")))
    with tabs["Memory"], short_errors("the Memory tab"):
        if tabs["Memory"].open:
            memory_tab(snap, prev, decode, lab.figures.get)
    with tabs["Text"], short_errors("the Text tab"):
        if tabs["Text"].open:
            st.markdown(text_html(snap, decode), unsafe_allow_html=True)
            how_to_read("text")
    with tabs["Events"], short_errors("the Events tab"):
        if tabs["Events"].open:
            events_tab(snaps, snap)
    with tabs["Tree"], short_errors("the Tree tab"):
        if tabs["Tree"].open:
            st.plotly_chart(beam_tree_figure(snap, snaps), key="fig_tree", config=CHART, theme=None)
            how_to_read("tree")
    with tabs["Waste"], short_errors("the Waste tab"):
        if tabs["Waste"].open:
            waste_tab(lab, snap, snaps)
    with tabs["Compare"], short_errors("the Compare tab"):
        if tabs["Compare"].open:
            compare_tab(lab)
    with tabs["Watch vLLM"], short_errors("the Watch vLLM tab"):
        if tabs["Watch vLLM"].open:
            watch_tab()
    with tabs["Export"], short_errors("the Export tab"):
        if tabs["Export"].open:
            export_tab(lab, snaps)


@guarded
def _on_compare_step() -> None:
    st.session_state.lab.comparison().step()


@guarded
def _on_compare_reset() -> None:
    st.session_state.lab.comparison(fresh=True)


def compare_tab(lab: Lab) -> None:
    """A v0 and a v1 engine on the same requests, stepped together."""
    if lab.engine is None or lab.replaying:
        st.info("The comparison runs on the live engine's settings (not on a replayed trace).")
        return
    cmp = lab.comparison()
    st.markdown(f"**What differs here:** {COMPARE_NOTES.get(lab.settings.scenario, '')}")
    c = st.columns([1, 1, 1, 3])
    c[0].button("Step both", type="primary", key="cmp_step", disabled=cmp.finished,
                on_click=_on_compare_step, width="stretch")
    run = c[1].button("Run both to the end", key="cmp_run", disabled=cmp.finished,
                      width="stretch")
    c[2].button("Reset both", key="cmp_reset", on_click=_on_compare_reset, width="stretch")
    if run:
        bar = st.progress(0.0, text="running both engines…")
        for i in range(500):
            if not cmp.step():
                break
            bar.progress(min(1.0, (i + 1) / 100), text=f"step {i + 1}")
        st.rerun(scope="app")
    table = compare_table(cmp)
    if len(table.columns):
        st.dataframe(table.astype(str), width="stretch")
    cols = st.columns(2, gap="medium")
    for col, sem in zip(cols, ("v0", "v1")):
        with col:
            st.markdown(f"#### {ENGINES[sem]}")
            snap = cmp.snapshot(sem)
            if snap is None:
                st.warning(cmp.errors.get(sem, "not available"))
                continue
            st.caption(f"step {snap.step} · {snap.kind} · "
                       f"{snap.stats.num_running} running · {snap.stats.num_waiting} waiting")
            prev = cmp.engines[sem].history[-2] if len(cmp.engines[sem].history) > 1 else None
            st.info(narrate(snap, prev, lab.decode))
            st.plotly_chart(lab.figures.get(pool_figure, snap, lab.decode), key=f"cmp_pool_{sem}",
                            config=CHART, theme=None)
            st.plotly_chart(lab.figures.get(block_table_figure, snap, lab.decode), key=f"cmp_tables_{sem}",
                            config=CHART, theme=None)


def waste_tab(lab: Lab, snap, snaps) -> None:
    headline = waste_headline(snap)
    if headline:
        st.markdown(f"**{headline}**")
    st.plotly_chart(waste_figure(snap, snaps), key="fig_waste", config=CHART, theme=None)
    st.plotly_chart(address_space_figure(snap), key="fig_slots", config=CHART, theme=None)
    how_to_read("waste")
    table = request_table(snap)
    if len(table):
        st.markdown("**Per request, this step** (slots; None = not admitted by that "
                    "allocator at this step)")
        st.dataframe(table, hide_index=True)
    sweep = lab.block_size_sweep()
    if sweep is not None:
        st.plotly_chart(block_size_sweep_figure(sweep, snap.block_size), key="fig_sweep",
                        config=CHART, theme=None)


def memory_tab(snap, prev, decode, figure) -> None:
    """``figure(builder, *args)`` builds a figure, or reuses the one built for these snapshots."""
    left, right = st.columns([1, 1], gap="medium")
    with left:
        st.plotly_chart(figure(block_table_figure, snap, decode), key="fig_tables", config=CHART,
                        theme=None)
        how_to_read("tables")
        rows = cow_rows(snap, prev)
        st.markdown(f"**Copy-on-write copies this step: {len(rows)}**")
        if rows:
            st.table(pd.DataFrame(rows).set_index("seq"))
            st.plotly_chart(figure(cow_figure, snap, prev), key="fig_cow", config=CHART, theme=None)
        how_to_read("cow")
    with right:
        st.plotly_chart(figure(pool_figure, snap, decode), key="fig_pool", config=CHART, theme=None)
        how_to_read("pool")


def events_tab(snaps, snap) -> None:
    st.plotly_chart(timeline_figure(snaps, snap.step), key="fig_timeline", config=CHART, theme=None)
    how_to_read("timeline")
    if snap.events:
        st.markdown(f"**Events of step {snap.step}** (in order)")
        st.dataframe(pd.DataFrame([{"kind": e.kind, "fields": {k: v for k, v in e.to_dict().items()
                                                               if k != "kind"}}
                                   for e in snap.events]).astype(str),
                     hide_index=True, height=min(400, 38 + 35 * len(snap.events)))


def export_tab(lab: Lab, snaps) -> None:
    name = (lab.trace_name.rsplit(".", 1)[0] if lab.replaying else lab.settings.scenario)
    st.download_button("Download trace (JSON: events + snapshots)",
                       data=lambda: trace_json(snaps), file_name=f"paged-lab-{name}.json",
                       mime="application/json", on_click="ignore")
    st.download_button("Download metrics (CSV: pool stats + accounting per step)",
                       data=lambda: metrics_csv(snaps), file_name=f"paged-lab-{name}.csv",
                       mime="text/csv", on_click="ignore")
    decode = lab.decode
    st.download_button("Download slides (HTML: an animation of the pool and block tables, one "
                       "frame per step; opens offline in any browser)",
                       data=lambda: slides_html(snaps, decode, lambda s: narrate(s, None, decode),
                                                title=f"PagedAttention Lab: {name}"),
                       file_name=f"paged-lab-{name}-slides.html", mime="text/html",
                       on_click="ignore")
    st.caption(f"{len(snaps)} snapshots kept (steps {snaps[0].step}–{snaps[-1].step}). Load "
               "a trace back with the sidebar's uploader to replay it without an engine. Each "
               "figure's camera button (top right of the figure) saves it as a PNG.")


@st.fragment(run_every=_MAIN_TIMER)
def main_area() -> None:
    lab: Lab | None = st.session_state.get("lab")
    if lab is None:                      # get_lab failed: its short error is already shown
        return
    if lab.released:                     # idle-released: get_lab (a whole-page run) revives it
        st.rerun(scope="app")
    # in use while drawn (Play's timer reruns only this fragment, so this is its activity)
    with lab.in_use(), short_errors("the lab"):
        _main_area(lab)


def _main_area(lab: Lab) -> None:
    if lab.engine is None and not lab.replaying:
        if lab.error:
            st.error(lab.error)
        st.info("No engine yet: fix the settings in the sidebar and press **Apply & reset**.")
        return
    error_slot = st.empty()              # filled after the controls ran (a Step clears errors)
    lab.tick(play_interval())
    if _play_timer() != _MAIN_TIMER:     # this run's module: the timer the browser has
        st.rerun(scope="app")            # Play's state changed: re-arm the timer (above)
    title = (f"Replay: {lab.trace_name}" if lab.replaying
             else SCENARIOS[lab.settings.scenario].label)
    st.subheader(title, anchor=False)
    controls(lab)
    presenter_row(lab)
    if lab.error:
        error_slot.error(lab.error)
    elif lab.notice:
        error_slot.warning(lab.notice)
    if st.session_state.get("w_mode") == "Lessons" and not lab.replaying:
        lesson_panel(lab)
    snap = lab.current()
    total = lab.snapshots()[-1].step
    state = ("finished" if lab.finished and not lab.replaying else
             "playing" if lab.playing else "paused")
    info, slider = st.columns([2, 3], vertical_alignment="center")
    info.caption(f"Step **{snap.step}** of {total} · {ENGINES.get(snap.semantics, snap.semantics)}"
                 f" · {snap.kind} · {state} · model "
                 f"`{snap.model}` · `{snap.backend}` · block size {snap.block_size}")
    with slider:
        history_slider(lab)
    if "failed" in snap.backend:
        st.warning(f"A Triton kernel could not run on this machine, so the torch reference ran "
                   f"that op instead (outputs are unchanged): `{snap.backend}`")
    with short_errors("this view"):
        views(lab)
    st.caption(f"rendered step {snap.step}")


st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide",
                   initial_sidebar_state="expanded")
st.markdown(CSS, unsafe_allow_html=True)
if st.query_params.get("projector") == "1" and "w_projector" not in st.session_state:
    st.session_state.w_projector = True      # ?projector=1 opens in the projector layout
if st.session_state.get("w_projector"):
    st.markdown(PROJECTOR_CSS, unsafe_allow_html=True)
st.html(KEYS_JS, unsafe_allow_javascript=True)
st.html(STEP_QUEUE_JS, unsafe_allow_javascript=True)
with short_errors("the page"):
    _lab = get_lab()
    with _lab.in_use():
        sidebar(_lab)
main_area()
