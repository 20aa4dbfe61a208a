"""The Export tab: the trace (JSON), the metrics (CSV) and slides (HTML), built on download."""
from __future__ import annotations

import streamlit as st

from app import narration, trace_io
from app.figures import slides
from app.views.common import Shown


def draw(shown: Shown) -> None:
    lab, snaps = shown.lab, shown.snaps
    name = (lab.trace_name.rsplit(".", 1)[0] if lab.replaying else lab.settings.scenario)
    st.download_button("Download trace (gzip JSON: events + snapshots; uploads back as it is)",
                       data=lambda: trace_io.trace_gzip(snaps),
                       file_name=f"paged-lab-{name}.json.gz", mime="application/gzip",
                       on_click="ignore")
    st.download_button("Download metrics (CSV: pool stats + accounting per step)",
                       data=lambda: trace_io.metrics_csv(snaps), file_name=f"paged-lab-{name}.csv",
                       mime="text/csv", on_click="ignore")
    decode = lab.decode
    st.download_button("Download slides (HTML: an animation of the pool and block tables, one "
                       "frame per step; opens offline in any browser)",
                       data=lambda: slides.slides_html(
                           snaps, decode, lambda s: narration.narrate(s, None, decode),
                           title=f"PagedAttention Lab: {name}"),
                       file_name=f"paged-lab-{name}-slides.html", mime="text/html",
                       on_click="ignore")
    st.caption(f"{len(snaps)} snapshots kept (steps {snaps[0].step}–{snaps[-1].step}). Load "
               "a trace back with the sidebar's uploader to replay it without an engine. Each "
               "figure's camera button (top right of the figure) saves it as a PNG.")
