"""The Memory tab: the block tables and the pool of the step shown, and its copy-on-write
copies."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app.figures import block_tables, cow, pool_grid
from app.views.common import Shown, how_to_read


def draw(shown: Shown) -> None:
    snap, prev, decode = shown.snap, shown.prev, shown.decode
    left, right = st.columns([1, 1], gap="medium")
    with left:
        shown.chart(block_tables.block_table_figure, snap, decode, key="fig_tables", how="tables")
        rows = cow.cow_rows(snap, prev)
        st.markdown(f"**Copy-on-write copies this step: {len(rows)}**")
        if rows:
            st.table(pd.DataFrame(rows).set_index("seq"))
            shown.chart(cow.cow_figure, snap, prev, key="fig_cow")
        how_to_read("cow")
    # the CPU swap pool only where the engine swaps (a replay: where its trace swapped)
    swaps = (any(b.ref_count for s in shown.snaps for b in s.cpu_blocks) if shown.lab.replaying
             else shown.lab.settings.preemption_mode == "swap")
    with right:
        shown.chart(pool_grid.pool_figure, snap, decode, True, swaps, key="fig_pool", how="pool")
