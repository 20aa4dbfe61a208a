"""The Waste tab: the same requests on contiguous allocators beside the paged pool, per request,
and swept over block sizes."""
from __future__ import annotations

import streamlit as st

from app.figures import address_space
from app.figures import waste as waste_figures
from app.views.common import Shown


def draw(shown: Shown) -> None:
    snap, snaps = shown.snap, shown.snaps
    headline = waste_figures.waste_headline(snap)
    if headline:
        st.markdown(f"**{headline}**")
    shown.chart(waste_figures.waste_figure, snap, snaps, key="fig_waste")
    shown.chart(address_space.address_space_figure, snap, key="fig_slots", how="waste")
    table = waste_figures.request_table_long(snap)
    if len(table):
        st.markdown("**Per request, this step**, in KV slots. A slab stores the prompt once per "
                    "sequence (with n samples, n copies), which paging shares: slots = tokens "
                    "stored + empty slots.")
        st.dataframe(table.style.format(na_rep="—"), hide_index=True, width="stretch")
    sweep = shown.lab.block_size_sweep()
    if sweep is not None:
        shown.chart(waste_figures.block_size_sweep_figure, sweep, snap.block_size,
                    key="fig_sweep")
