"""The Events tab: a lane per event kind over the steps, and the events of the step shown."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app.figures import timeline
from app.views.common import Shown


def draw(shown: Shown) -> None:
    snap = shown.snap
    shown.chart(timeline.timeline_figure, shown.snaps, snap.step, key="fig_timeline",
                how="timeline")
    if snap.events:
        st.markdown(f"**Events of step {snap.step}** (in order)")
        st.dataframe(pd.DataFrame([{"kind": e.kind, "fields": {k: v for k, v in e.to_dict().items()
                                                               if k != "kind"}}
                                   for e in snap.events]).astype(str),
                     hide_index=True, height=min(400, 38 + 35 * len(snap.events)))
