"""Slides: the whole run as one Plotly animation (pool + block tables per step, a slider and a
Play button), saved as one self-contained HTML file that opens offline in any browser.

Each frame reuses the page's own figure builders (pool_grid, block_tables) on that step's
snapshot, so the slides show exactly what the page showed.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.figures.block_tables import block_table_figure
from app.figures.common import FONT_SIZE
from app.figures.pool_grid import pool_figure


def _panels(snap, decode) -> tuple[go.Heatmap, go.Heatmap]:
    pool = pool_figure(snap, decode, show_moves=False)
    tables = block_table_figure(snap, decode)
    heat = [t for t in pool.data if isinstance(t, go.Heatmap)]
    table = [t for t in tables.data if isinstance(t, go.Heatmap)]
    empty = go.Heatmap(z=[[None]], showscale=False, hoverinfo="skip")
    return (heat[0] if heat else empty), (table[0] if table else empty)


def _caption(snap, narration) -> str:
    head = f"Step {snap.step} · {snap.kind}"
    return head if narration is None else f"{head}<br><sup>{narration(snap)[:160]}</sup>"


def slides_figure(snapshots, decode=None, narration=None) -> go.Figure:
    """One frame per snapshot; ``narration(snapshot) -> str`` (optional) captions each frame."""
    snaps = list(snapshots)
    if not snaps:
        raise ValueError("no snapshots to export")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.08,
                        subplot_titles=("Physical block pool", "Block tables"))
    pool, table = _panels(snaps[0], decode)
    fig.add_trace(pool, row=1, col=1)
    fig.add_trace(table, row=1, col=2)
    frames = []
    for snap in snaps:
        p, t = _panels(snap, decode)
        frames.append(go.Frame(name=str(snap.index), data=[p, t], traces=[0, 1],
                               layout=dict(title=dict(text=_caption(snap, narration)))))
    fig.frames = frames
    fig.update_yaxes(autorange="reversed", showgrid=False)
    fig.update_xaxes(showgrid=False, showticklabels=False)
    slider = dict(active=0, currentvalue=dict(prefix="step "), pad=dict(t=30), steps=[
        dict(method="animate", label=str(s.step),
             args=[[str(s.index)], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                       transition=dict(duration=0))])
        for s in snaps])
    play = dict(type="buttons", direction="left", x=0, y=-0.08, xanchor="left", showactive=False,
                buttons=[dict(label="▶ Play", method="animate",
                              args=[None, dict(frame=dict(duration=700, redraw=True),
                                               fromcurrent=True, transition=dict(duration=0))]),
                         dict(label="⏸ Pause", method="animate",
                              args=[[None], dict(mode="immediate", frame=dict(duration=0))])])
    fig.update_layout(title=dict(text=_caption(snaps[0], narration), font=dict(size=FONT_SIZE + 2)),
                      font=dict(size=FONT_SIZE), template="plotly_white", height=720,
                      margin=dict(l=20, r=20, t=110, b=120), sliders=[slider],
                      updatemenus=[play])
    return fig


def slides_html(snapshots, decode=None, narration=None, title: str = "PagedAttention Lab") -> str:
    """The animation as one HTML file with plotly.js inlined (no network needed to open it)."""
    fig = slides_figure(snapshots, decode, narration)
    html = fig.to_html(full_html=True, include_plotlyjs=True, auto_play=False,
                       config={"displaylogo": False})
    return html.replace("<head>", f"<head><title>{title}</title>", 1)
