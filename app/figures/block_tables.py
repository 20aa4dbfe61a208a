"""Block tables: each live sequence's logical blocks (columns) -> the physical block they map to.

A cell reads ``P7 ×3`` when physical block 7 is referenced by 3 tables (shared); the colour is
the physical block's state, as in the pool grid. Swapped sequences point into the CPU pool (C3).
"""
from __future__ import annotations

import plotly.graph_objects as go

from app.figures.common import (FONT_SIZE, NARROW_PX, PROJECTOR_MIN_FONT, STATE_COLORS,
                                STATE_LABELS, block_label,
                                discrete_colorscale, empty, fit_cell_labels, layout, legend_note,
                                make_figure, short_id, show_token, tick_margin, token_strings)

CELL_FONT = 13

STATES = ("used", "shared", "swapped", "cached")
_CODE = {s: i for i, s in enumerate(STATES)}
LIVE = ("running", "waiting", "swapped")


def table_rows(snapshot):
    """The sequences drawn: live ones, plus any other that still holds blocks."""
    return [s for s in snapshot.sequences if s.status in LIVE or s.block_table]


def block_table_figure(snapshot, decode=None) -> go.Figure:
    title = f"Block tables — step {snapshot.step}"
    seqs = table_rows(snapshot)
    if not any(s.block_table for s in seqs):
        waiting = sum(1 for s in snapshot.sequences if s.status == "waiting")
        return empty(title, f"no block table yet: {waiting} sequence(s) waiting in the queue"
                     if waiting else "no live sequences (all finished, or nothing queued)")
    gpu = {b.block_id: b for b in snapshot.blocks}
    cpu = {b.block_id: b for b in snapshot.cpu_blocks}
    width = max(1, max(len(s.block_table) for s in seqs))
    z, text, hover, ylabels = [], [], [], []
    for s in seqs:
        zrow, trow, hrow = [None] * width, [""] * width, [""] * width
        for logical, phys in enumerate(s.block_table):
            block = (cpu if s.device == "cpu" else gpu).get(phys)
            rc = block.ref_count if block else 0
            state = "swapped" if s.device == "cpu" else ("shared" if rc > 1 else "used")
            label = block_label(phys, s.device)
            zrow[logical] = _CODE[state] + 0.5
            trow[logical] = f"<b>{label}</b>" + (f" ×{rc}" if rc > 1 else "")
            lines = [f"seq {s.seq_id} (request {s.request_id}), logical block {logical} → "
                     f"<b>{label}</b>",
                     f"refcount {rc}" + (f" · filled {block.filled}/{snapshot.block_size}" if block else "")]
            if block is not None and block.seq_ids:
                lines.append(("held by seq " if len(block.seq_ids) == 1 else "held by seqs ")
                             + ", ".join(map(str, block.seq_ids)))
            toks = s.token_ids[logical * snapshot.block_size:(logical + 1) * snapshot.block_size]
            lines.append("tokens: " + " | ".join(show_token(t) for t in token_strings(toks, decode)))
            hrow[logical] = "<br>".join(lines)
        z.append(zrow)
        text.append(trow)
        hover.append(hrow)
        ylabels.append(f"seq {s.seq_id} · req {short_id(s.request_id)} · {s.status}")
    left = tick_margin(ylabels)
    # the plot is what the narrowest column leaves after the row labels; in the projector the
    # row labels grow with the font (for_projector scales the left margin the same way)
    cell_px = max(1.0, NARROW_PX - left - 10) / width
    proj_cell_px = max(1.0, NARROW_PX - left * PROJECTOR_MIN_FONT / FONT_SIZE - 10) / width
    traces = [dict(
        type="heatmap", z=z, x=[f"L{i}" for i in range(width)], y=ylabels,
        text=fit_cell_labels(text, cell_px, CELL_FONT),
        meta=dict(labels=text, cell_px=cell_px, projector_scale=proj_cell_px / cell_px),
        texttemplate="%{text}", textfont=dict(size=CELL_FONT), customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", xgap=3, ygap=3, zmin=0, zmax=len(STATES),
        showscale=False, colorscale=discrete_colorscale([STATE_COLORS[s] for s in STATES]))]
    note, bottom = legend_note(
        [(STATE_LABELS[s], STATE_COLORS[s]) for s in
         ("used", "shared") + (("swapped",) if any(q.device == "cpu" for q in seqs) else ())],
        per_line=2, right=True)
    return make_figure(traces, layout(
        # fixed margins, no automargin (see pool_grid): the left one fits the longest row label
        # rows of 40 px hold one line of 18-px labels: the projector keeps this height
        title, height=120 + bottom + 40 * len(seqs), meta=dict(rows_fit_projector=True),
        margin=dict(l=left, r=10, t=70, b=bottom),
        annotations=[note],
        yaxis=dict(automargin=False, autorange="reversed", showgrid=False),
        xaxis=dict(automargin=False, side="top", showgrid=False, title=None)))
