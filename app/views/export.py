"""The Export tab: the trace (JSON), the metrics (CSV) and slides (HTML), built on download."""
from __future__ import annotations

import streamlit as st

from app import narration, trace_io
from app.figures import slides
from app.scenarios import SCENARIOS
from app.views import link
from app.views.common import Shown


def draw(shown: Shown) -> None:
    lab, snaps = shown.lab, shown.snaps
    name = (lab.trace_name.rsplit(".", 1)[0] if lab.replaying else lab.settings.scenario)
    # the deck's title is what the page calls the scenario, not its key (issue 38)
    heading = (lab.trace_name if lab.replaying else SCENARIOS[lab.settings.scenario].label)
    st.download_button("Download trace (gzip JSON: events + snapshots; uploads back as it is)",
                       data=lambda: trace_io.trace_gzip(snaps),
                       file_name=f"paged-lab-{name}.json.gz", mime="application/gzip",
                       on_click="ignore")
    st.download_button("Download metrics (CSV: pool stats + accounting per step)",
                       data=lambda: trace_io.metrics_csv(snaps), file_name=f"paged-lab-{name}.csv",
                       mime="text/csv", on_click="ignore")
    decode = lab.decode
    # slides take a second or two to build (two figures per slide), so they are prepared on
    # request and their size is stated before the download
    key = (id(lab), len(snaps), snaps[-1].index, snaps[0].index, name)
    deck = st.session_state.get("slides_deck")
    if deck is not None and deck[0] != key:
        deck = None
    if deck is None:
        if st.button("Prepare slides (HTML: pool and block tables at projector size with each "
                     "step's narration; opens offline in any browser)", key="slides_prepare"):
            prev = {id(s): (snaps[i - 1] if i else None) for i, s in enumerate(snaps)}
            run = st.session_state.get("lesson_run") if st.session_state.get("w_mode") == \
                "Lessons" and not lab.replaying else None
            questions = ([(cp.text, cp.question.text if cp.question else None)
                          for cp in run.lesson.checkpoints] if run is not None else [])
            with st.spinner("building the slides…"):
                # the narration as the page says it (with the step before: ref counts), less
                # the page's "Press Step."
                built = slides.slides_deck(
                    snaps, decode, lambda s: narration.narrate(s, prev[id(s)], decode, cue=False),
                    title=f"PagedAttention Lab: {heading}"
                    + (f" · Lesson {run.lesson.title}" if run is not None else ""),
                    questions=questions)
            st.session_state.slides_deck = deck = (key, built)
    if deck is not None:
        st.download_button(f"Download slides ({deck[1].summary()})", data=deck[1].html,
                           file_name=f"paged-lab-{name}-slides.html", mime="text/html",
                           on_click="ignore")
    if not lab.replaying:
        query = link.link_query(lab)
        st.markdown("**Link to this view** (for a slide: it opens the same run, on the student's "
                    "own engine, at this step or checkpoint)")
        st.code(link.base_url() + query, language=None)
    st.caption(f"{len(snaps)} snapshots kept (steps {snaps[0].step}–{snaps[-1].step}). Load "
               "a trace back with the sidebar's uploader to replay it without an engine. Each "
               "figure's camera button (top right of the figure) saves it as a PNG.")
