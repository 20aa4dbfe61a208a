"""PagedAttention Lab — the page (`streamlit run app`).

Wiring only: the views are in app/views/ (one module each, the tabs in app/views/tabs.py), the
session's engine lives in app.lab.Lab, presets in app.scenarios, every figure is a pure
function in app.figures.*, the narration in app.narration, traces in app.trace_io.
The page draws only from snapshots, their events and public Engine methods.
Hosted for a class (app.hosting): the Model field offers only the operator's models, uploads
are bounded, idle sessions are released, and no exception shows a traceback or a server path:
callbacks and views catch what they did not expect, log it, and show one short line.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # `streamlit run app` puts only app/ on the path
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app import process_memory  # noqa: E402

process_memory.limit_heap_arenas()     # once per process, before the sessions' threads allocate
from app import number_input_fix  # noqa: E402

number_input_fix.install()             # an infinite value sent to an integer field (issue 45)
from app import no_ip_lookup  # noqa: E402

no_ip_lookup.install()                 # no request off this machine (issue 45)
from app.views import controls, main_view, page_style, session, sidebar  # noqa: E402
from app.views.common import short_errors  # noqa: E402

# Play's timer for this page run, read before anything is drawn: the main view's fragment runs
# on it and compares it with the timer Play needs (app/views/main_view.py says why)
timer = controls.play_timer()
page_style.apply()
with short_errors("the page"):
    lab = session.get_lab()
    with lab.in_use():
        sidebar.draw(lab)
main_view.main_fragment(timer)()
