"""This step's copy-on-write copies: one arrow per copy, shared source block -> private copy.

The refcount shown is the source block's refcount just before that copy (from the previous
snapshot, minus the copies of the same block earlier in this step).
"""
from __future__ import annotations

import plotly.graph_objects as go

from app.figures.common import COW_COLOR, OKABE_ITO, block_label, empty, layout, make_figure


def cow_rows(snapshot, previous=None) -> list[dict]:
    """One dict per cow event of the step, in order."""
    rc_before = {b.block_id: b.ref_count for b in previous.blocks} if previous else {}
    rows = []
    for e in snapshot.events:
        if e.kind != "cow":
            continue
        rc = rc_before.get(e.src)
        rows.append({"seq": e.seq_id, "logical block": e.logical, "shared src": block_label(e.src),
                     "copy dst": block_label(e.dst), "src refcount before": rc})
        if rc is not None:
            rc_before[e.src] = rc - 1
    return rows


def cow_figure(snapshot, previous=None) -> go.Figure:
    """Drawn on every step that copies (v0's parallel sampling and beams), so built from plain
    dicts by make_figure (13 -> ~1 ms for two copies, measured; validated in the tests)."""
    title = f"Copy-on-write this step — step {snapshot.step}"
    rows = cow_rows(snapshot, previous)
    if not rows:
        return empty(title, "no copy-on-write in this step", height=160)
    ys = list(range(len(rows)))

    def blocks(x: int, name: str, key: str, color: str, hover, **text) -> dict:
        return dict(type="scatter", x=[x] * len(rows), y=ys, mode="markers+text", name=name,
                    text=[f"<b>{r[key]}</b>" for r in rows], textposition="middle center",
                    marker=dict(symbol="square", size=46, color=color),
                    hovertext=[hover(r) for r in rows], hoverinfo="text", **text)
    traces = [
        blocks(0, "shared source", "shared src", OKABE_ITO["orange"],
               lambda r: f"{r['shared src']}: refcount {r['src refcount before']} before the copy"),
        blocks(1, "private copy", "copy dst", OKABE_ITO["blue"],
               lambda r: f"{r['copy dst']}: seq {r['seq']}'s private copy",
               textfont=dict(color="white")),
    ]
    notes = []
    for y, r in zip(ys, rows):
        rc = r["src refcount before"]
        notes.append(dict(x=1, y=y, ax=0, ay=y, xref="x", yref="y", axref="x", ayref="y",
                          showarrow=True, arrowhead=3, arrowwidth=3, arrowcolor=COW_COLOR,
                          standoff=26, startstandoff=26, text="", name="cow"))
        notes.append(dict(x=0.5, y=y, text=f"seq {r['seq']}, L{r['logical block']}"
                          + (f" (rc {rc})" if rc is not None else ""), showarrow=False,
                          yshift=14, font=dict(size=13), name="cow-label"))
    return make_figure(traces, layout(
        title, 110 + 60 * len(rows), annotations=notes,
        xaxis=dict(visible=False, range=[-0.4, 1.4]),
        yaxis=dict(visible=False, autorange="reversed", range=[len(rows) - 0.5, -0.5])))


def cow_arrow_count(fig: go.Figure) -> int:
    return sum(1 for a in fig.layout.annotations if a.name == "cow")
