"""The Compare tab: a v0 and a v1 engine on the same requests, stepped together (the engines
and their numbers: app/compare.py); under the Engine choice "Real vLLM", our v1 and the real
vLLM in lockstep, with each step's agreement (real_vllm/lockstep.py, real_vllm/compare.py)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.sched.registry import SEMANTICS

from app import compare as lockstep
from app import narration
from app.figures import block_tables, pool_grid
from app.scenarios import COMPARE_NOTES, REAL_VLLM
from app.turns import TURNS
from app.views import controls
from app.views.common import REAL_VLLM_LABEL, Shown, guarded

AGREEMENT_FIELDS = ("tokens scheduled, preemptions, queues, computed tokens, block tables, ref "
                    "counts, free blocks, cached hashes, KV events, sampled tokens, finishes")


@guarded
def _on_compare_step() -> None:
    lab = st.session_state.lab
    lab.comparison()
    if lab.step_both():
        lab.error = None


@guarded
def _on_compare_reset() -> None:
    lab = st.session_state.lab
    lab.apply(lab.settings)              # the lab's engine is one of the two: both restart
    lab.comparison(fresh=True)


@guarded
def _on_real_vllm() -> None:
    from app.views.sidebar import switch_engine
    switch_engine(REAL_VLLM)
    st.session_state[controls.FULL_RERUN] = True  # the sidebar's Engine choice and settings changed


def draw(shown: Shown) -> None:
    lab = shown.lab
    if lab.engine is None or lab.replaying:
        st.info("The comparison runs on the live engine's settings (not on a replayed trace).")
        return
    if lab.engine.lockstep is not None:
        draw_lockstep(shown)
        return
    cmp = lab.comparison()
    st.markdown(f"**What differs here:** {COMPARE_NOTES.get(lab.settings.scenario, '')}")
    st.caption(f"The {SEMANTICS[cmp.main].label} side is the page's own engine (the Step "
               "button, → and the narration above step and tell it); the other runs the same "
               "requests beside it, step for step.")
    c = st.columns([1, 1.5, 1.1, 2.6])
    c[0].button("Step both", type="primary", key="cmp_step",
                disabled=cmp.finished and lab.at_latest,
                on_click=_on_compare_step, width="stretch")
    run = c[1].button("Run both to the end", key="cmp_run", disabled=cmp.finished,
                      width="stretch")
    c[2].button("Reset both", key="cmp_reset", on_click=_on_compare_reset, width="stretch")
    c[3].button("Compare our v1 with real vLLM instead", key="cmp_real",
                on_click=_on_real_vllm, width="stretch",
                help="switches the Engine to Real vLLM: our vLLM v1 then runs the same requests "
                     "beside it, compared after every step")
    if run:
        bar = st.progress(0.0, text="running both engines…")
        lab.show(None)
        for i in range(500):
            if not lab.step_both():
                break
            bar.progress(min(1.0, (i + 1) / 100), text=f"step {i + 1}")
            TURNS.pass_turn()            # the others in this process wait one step (turns.py)
        st.rerun(scope="app")
    table = lockstep.compare_table(cmp)
    if len(table.columns):               # every row shown, no inner scroll, labels whole
        st.dataframe(table.astype(str), width="stretch", height=38 + 35 * len(table),
                     column_config={"_index": st.column_config.TextColumn(width="large")})
    why = running_differs(cmp.snapshot(n) for n in SEMANTICS)
    if why:
        st.caption(why)
    for col, (name, rules) in zip(st.columns(len(SEMANTICS), gap="medium"), SEMANTICS.items()):
        with col:
            st.markdown(f"#### {rules.label}")
            snap = cmp.snapshot(name)
            if snap is None:
                st.warning(cmp.errors.get(name, "not available"))
                continue
            st.caption(f"step {snap.step} · {snap.kind} · {running_words(snap)} · "
                       f"{snap.stats.num_waiting} waiting")
            history = cmp.engines[name].history
            prev = history[-2] if len(history) > 1 else None
            st.info(narration.narrate(snap, prev, lab.decode))
            shown.chart(pool_grid.pool_figure, snap, lab.decode, key=f"cmp_pool_{name}")
            shown.chart(block_tables.block_table_figure, snap, lab.decode,
                        key=f"cmp_tables_{name}")


def running_words(snap) -> str:
    """"1 running request (4 sequences)": a scheduler counts requests (v0: sequence groups,
    v1: requests, n samples being n child requests), the pool holds sequences."""
    seqs = sum(1 for q in snap.sequences if q.status == "running")
    n = snap.stats.num_running
    return (f"{n} running request{'s' if n != 1 else ''}"
            + (f" ({seqs} sequences)" if seqs != n else ""))


def running_differs(snaps) -> str:
    """Why the engines count different running requests for the same running sequences
    (issue 38: "1 running" beside "4 running", with no word on why); "" when they agree."""
    snaps = [s for s in snaps if s is not None]
    counts = {(s.stats.num_running, sum(1 for q in s.sequences if q.status == "running"))
              for s in snaps}
    if len({c[0] for c in counts}) < 2 or len({c[1] for c in counts}) != 1:
        return ""
    return ("The same sequences run on both sides, counted differently: vLLM v0 runs a "
            "request's n samples as one sequence group (one request of n sequences), vLLM v1 "
            "as n child requests of one parent (n requests).")


def agreement_line(steps, step: int) -> str:
    """The agreement of lockstep step ``step`` (its number), in one line."""
    if step == 0:
        return "**Step 0**: nothing stepped yet. Each Step runs both engines and compares them."
    done = next((s for s in steps if s.theirs.step == step), None)
    if done is None:
        return f"**Step {step}**: not compared (older than the history kept)."
    if done.difference is None:
        return f"**Step {step}: identical** ({AGREEMENT_FIELDS} equal in both engines)."
    return f"**Step {step} differs**: {done.difference.split(': ', 1)[-1]}"


def draw_lockstep(shown: Shown) -> None:
    """Our v1 and the real vLLM on the same requests, every Step both; the step shown's
    agreement, the run's summary, and both engines' block tables side by side."""
    lab, engine = shown.lab, shown.lab.engine
    partner = engine.lockstep
    steps = partner.steps
    st.markdown(f"**Our vLLM v1 beside {engine.version}**, in lockstep: every Step runs both "
                "engines on the same token ids and compares what they did.")
    c = st.columns([1, 1.5, 3])
    c[0].button("Step both", type="primary", key="ls_step", disabled=lab.finished,
                on_click=controls.on_step, width="stretch")
    run = c[1].button("Run both to the end", key="ls_run", disabled=lab.finished,
                      width="stretch")
    if run:
        bar = st.progress(0.0, text="running both engines…")
        for i in range(500):
            if not lab.step():
                break
            bar.progress(min(1.0, (i + 1) / 100), text=f"step {i + 1}")
            TURNS.pass_turn()            # the others in this process wait one step (turns.py)
        st.rerun(scope="app")
    snap = shown.snap
    line = agreement_line(steps, snap.step)
    (st.success if "identical" in line or snap.step == 0 else st.error)(line)
    st.markdown(f"**Run so far: {partner.summary()}.**")
    if steps:
        rows = [{"step": s.theirs.step,
                 "tokens scheduled (vLLM)": ", ".join(f"req {r}: {n}" for r, n in
                                                      s.theirs.scheduled.items()) or "none",
                 "free blocks (ours / vLLM)": f"{s.ours.num_free_blocks} / "
                                              f"{s.theirs.num_free_blocks}",
                 "agreement": "identical" if s.difference is None else s.difference}
                for s in steps[-200:]]
        st.dataframe(pd.DataFrame(rows[::-1]), hide_index=True, width="stretch",
                     height=min(220, 38 + 35 * len(rows)))
    ours = next((s for s in reversed(partner.ours_history) if s.step == snap.step
                 and s.kind != "abort"), None)
    for col, (title, s) in zip(st.columns(2, gap="medium"),
                               (("Our vLLM v1", ours), (REAL_VLLM_LABEL, snap))):
        with col:
            st.markdown(f"#### {title}")
            if s is None:
                st.warning("this step is older than the history kept")
                continue
            st.caption(f"step {s.step} · {s.kind} · {s.stats.num_running} running · "
                       f"{s.stats.num_waiting} waiting · {s.stats.free_blocks} free blocks")
            key = "ours" if title != REAL_VLLM_LABEL else "vllm"
            shown.chart(block_tables.block_table_figure, s, lab.decode, key=f"ls_tables_{key}")
            shown.chart(pool_grid.pool_figure, s, lab.decode, key=f"ls_pool_{key}")
