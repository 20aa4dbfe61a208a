"""Shared look: the Okabe–Ito colour-blind-safe palette, block labels, projector-size fonts."""
from __future__ import annotations

import html

import plotly.graph_objects as go

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision
# deficiency. Shapes, text and line dashes carry the same information where it matters.
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
FREE_GREY = "#E8E8E8"

# physical block states as drawn in the pool grid and the block tables
STATE_COLORS = {
    "free": FREE_GREY,
    "used": OKABE_ITO["blue"],          # refcount 1
    "shared": OKABE_ITO["orange"],      # refcount > 1
    "cached": OKABE_ITO["green"],       # free, content kept for prefix reuse
    "swapped": OKABE_ITO["purple"],     # a CPU-pool block holding a swapped-out sequence's K/V
    "null": "#9E9E9E",                  # vLLM v1's block 0: never handed out (also labelled)
}
STATE_LABELS = {
    "free": "free", "used": "used (refcount 1)", "shared": "shared (refcount > 1)",
    "cached": "cached (free, reusable by hash)", "swapped": "swapped out (CPU pool)",
    "null": "null block (v1: never used)",
}
COW_COLOR = OKABE_ITO["vermillion"]
SWAP_COLOR = OKABE_ITO["purple"]
FONT_SIZE = 15                          # readable on a 1280x720 projector


def block_label(block_id: int, device: str = "gpu") -> str:
    """P7 for a device (GPU/pool) block, C3 for a CPU swap block."""
    return f"{'C' if device == 'cpu' else 'P'}{block_id}"


def show_token(text: str) -> str:
    """A token's text made visible and HTML-safe (spaces as ·, newlines as ↵)."""
    return html.escape(text.replace("\n", "↵").replace(" ", "·"))


def token_strings(token_ids, decode=None) -> list[str]:
    return list(decode(list(token_ids))) if decode else [f"<{t}>" for t in token_ids]


def style(fig: go.Figure, title: str, height: int | None = None, legend_y: float = -0.02
          ) -> go.Figure:
    fig.update_layout(title=dict(text=title, font=dict(size=FONT_SIZE + 2)),
                      font=dict(size=FONT_SIZE), template="plotly_white",
                      margin=dict(l=10, r=10, t=50, b=10), hoverlabel=dict(font_size=FONT_SIZE),
                      legend=dict(orientation="h", yanchor="top", y=legend_y, x=0))
    if height:
        fig.update_layout(height=height)
    return fig


def empty(title: str, message: str, height: int = 220) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=FONT_SIZE + 1, color="#555"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return style(fig, title, height)


def legend_swatch(fig: go.Figure, name: str, color: str, symbol: str = "square") -> None:
    """A legend entry with no data (heatmaps have no per-category legend of their own)."""
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                             marker=dict(size=14, color=color, symbol=symbol,
                                         line=dict(color="#444", width=1)),
                             hoverinfo="skip"))


def discrete_colorscale(colors: list[str]) -> list:
    """A stepped colorscale: z = i + 0.5 (with zmin 0, zmax len) gets colors[i]."""
    k = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale
