"""The Compare tab: a v0 and a v1 engine on the same requests, stepped together (the engines
and their numbers: app/compare.py)."""
from __future__ import annotations

import streamlit as st

from engine.sched.registry import SEMANTICS

from app import compare as lockstep
from app import narration
from app.figures import block_tables, pool_grid
from app.scenarios import COMPARE_NOTES
from app.views.common import Shown, guarded


@guarded
def _on_compare_step() -> None:
    st.session_state.lab.comparison().step()


@guarded
def _on_compare_reset() -> None:
    st.session_state.lab.comparison(fresh=True)


def draw(shown: Shown) -> None:
    lab = shown.lab
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
    table = lockstep.compare_table(cmp)
    if len(table.columns):
        st.dataframe(table.astype(str), width="stretch")
    for col, (name, rules) in zip(st.columns(len(SEMANTICS), gap="medium"), SEMANTICS.items()):
        with col:
            st.markdown(f"#### {rules.label}")
            snap = cmp.snapshot(name)
            if snap is None:
                st.warning(cmp.errors.get(name, "not available"))
                continue
            st.caption(f"step {snap.step} · {snap.kind} · "
                       f"{snap.stats.num_running} running · {snap.stats.num_waiting} waiting")
            history = cmp.engines[name].history
            prev = history[-2] if len(history) > 1 else None
            st.info(narration.narrate(snap, prev, lab.decode))
            shown.chart(pool_grid.pool_figure, snap, lab.decode, key=f"cmp_pool_{name}")
            shown.chart(block_tables.block_table_figure, snap, lab.decode,
                        key=f"cmp_tables_{name}")
