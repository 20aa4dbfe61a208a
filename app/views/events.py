"""The Events tab: a lane per event kind over the steps, and the events of the step shown;
under real vLLM also its prefix cache, rebuilt from the KV events it published."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import event_words
from app.figures import prefix_tree, timeline
from app.views.common import Shown


def draw(shown: Shown) -> None:
    snap = shown.snap
    shown.chart(timeline.timeline_figure, shown.snaps, snap.step, key="fig_timeline",
                how="timeline")
    if snap.events:
        st.markdown(f"**Events of step {snap.step}** (in order)")
        words = [event_words.describe(e, snap.block_size, shown.decode) for e in snap.events]
        st.dataframe(pd.DataFrame({"what happened": words}), hide_index=True, width="stretch",
                     height=min(400, 38 + 35 * len(words)))
        with st.expander("Raw event fields"):
            st.dataframe(pd.DataFrame([{k: str(v) for k, v in e.to_dict().items()}
                                       for e in snap.events]), hide_index=True,
                         height=min(400, 38 + 35 * len(words)))
    engine = shown.lab.engine
    cache_view = engine.cache_view if engine is not None else None
    if cache_view is not None and not shown.lab.replaying:
        st.markdown(f"**Real vLLM's prefix cache** after its latest step, rebuilt from the "
                    f"{cache_view.batches} KV event batches it published (BlockStored, "
                    "BlockRemoved), as the Watch vLLM tab rebuilds a `vllm serve`'s prefix cache.")
        shown.chart(_vllm_tree, cache_view, cache_view.batches, key="fig_vllm_tree")


def _vllm_tree(view, batches: int):
    """The tree of ``view`` after ``batches`` batches (the figure cache's key)."""
    return prefix_tree.prefix_tree_figure(view.blocks.values())
