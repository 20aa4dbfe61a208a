"""Waste comparison on the same requests: the paged pool vs contiguous allocators (vLLM paper,
Fig. 2 categories). Left: the shown step's KV slots per allocator. Middle: share of the busy
memory holding token states, over time. Right: requests waiting for memory, over time.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figures.common import FREE_GREY, OKABE_ITO, empty, style

CATEGORIES = {   # accounting field -> (label, colour)
    "token_states": ("token states", OKABE_ITO["green"]),
    "reserved": ("reserved (future tokens)", OKABE_ITO["yellow"]),
    "internal_fragmentation": ("internal fragmentation", OKABE_ITO["orange"]),
    "external_fragmentation": ("external fragmentation", OKABE_ITO["vermillion"]),
    "free": ("free", FREE_GREY),
}
ALLOCATOR_LABELS = {"paged": "Paged (this engine)", "max": "Contiguous Max",
                    "pow2": "Contiguous Pow2", "oracle": "Contiguous Oracle"}
ALLOCATOR_STYLE = {"paged": (OKABE_ITO["blue"], "solid", "circle"),
                   "max": (OKABE_ITO["vermillion"], "dot", "x"),
                   "pow2": (OKABE_ITO["orange"], "dash", "square"),
                   "oracle": (OKABE_ITO["purple"], "dashdot", "diamond-open")}


def token_state_share(a) -> float | None:
    """token states / busy (non-free) slots; None when nothing is busy (nothing admitted)."""
    busy = a.token_states + a.reserved + a.internal_fragmentation + a.external_fragmentation
    return a.token_states / busy if busy else None


def waste_figure(snapshot, history=()) -> go.Figure:
    title = f"Waste: paged vs contiguous, same requests — step {snapshot.step}"
    if not snapshot.accounting:
        return empty(title, "no accounting in this snapshot")
    fig = make_subplots(rows=1, cols=3, column_widths=[0.44, 0.28, 0.28], horizontal_spacing=0.09,
                        subplot_titles=("KV slots at this step", "token-state share of busy slots",
                                        "requests waiting"))
    names = [ALLOCATOR_LABELS.get(a.allocator, a.allocator)
             + (f"<br><i>{a.rejected} never fit</i>" if a.rejected else "")
             for a in snapshot.accounting]
    for field, (label, color) in CATEGORIES.items():
        values = [getattr(a, field) for a in snapshot.accounting]
        fig.add_trace(go.Bar(y=names, x=values, orientation="h", name=label, legendgroup=field,
                             marker=dict(color=color, line=dict(color="#444", width=0.5)),
                             text=[str(v) if v else "" for v in values], textposition="inside",
                             insidetextanchor="middle",
                             hovertemplate=f"%{{y}}: %{{x}} slots {label}<extra></extra>"),
                      row=1, col=1)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title="token slots", row=1, col=1)
    past = [s for s in history if s.step <= snapshot.step and s.kind != "init"] or [snapshot]
    steps = [s.step for s in past]
    for i, a in enumerate(snapshot.accounting):
        color, dash, symbol = ALLOCATOR_STYLE.get(a.allocator, ("#555", "solid", "circle"))
        series = [next((x for x in s.accounting if x.allocator == a.allocator), None) for s in past]
        label = ALLOCATOR_LABELS.get(a.allocator, a.allocator)
        fig.add_trace(go.Scatter(x=steps, y=[token_state_share(x) if x else None for x in series],
                                 mode="lines+markers", name=label, legendgroup=a.allocator,
                                 line=dict(color=color, dash=dash, width=3),
                                 marker=dict(symbol=symbol, size=8),
                                 hovertemplate=f"{label}<br>step %{{x}}: %{{y:.0%}}<extra></extra>"),
                      row=1, col=2)
        fig.add_trace(go.Scatter(x=steps, y=[x.waiting if x else None for x in series],
                                 mode="lines+markers", name=label, legendgroup=a.allocator,
                                 showlegend=False, line=dict(color=color, dash=dash, width=3),
                                 marker=dict(symbol=symbol, size=8),
                                 hovertemplate=f"{label}<br>step %{{x}}: %{{y}} waiting<extra></extra>"),
                      row=1, col=3)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", dtick=1, row=1, col=3)
    fig.update_xaxes(title="step", row=1, col=2)
    fig.update_xaxes(title="step", row=1, col=3)
    fig = style(fig, title, height=450, legend_y=-0.2)
    return fig
