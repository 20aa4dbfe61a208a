"""KV cache events over time, from PrefixCacheView.series_frame(): blocks stored (up) and
removed (down) per time bin, cache resets as dashed lines, and the number of cached blocks
after each batch. Time bins keep the bar count bounded on a long-running server."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.figures.common import OKABE_ITO, empty, style

MAX_BINS = 120


def binned(frame: pd.DataFrame, max_bins: int = MAX_BINS) -> pd.DataFrame:
    """stored / removed / cleared summed per time bin: one bin per batch while they fit."""
    if len(frame) <= max_bins:
        return frame[["time", "stored", "removed", "cleared"]].reset_index(drop=True)
    ts = frame["ts"].to_numpy()
    width = max((ts[-1] - ts[0]) / max_bins, 1e-3)
    bins = np.floor((ts - ts[0]) / width).astype(int)
    out = frame.groupby(bins)[["stored", "removed", "cleared"]].sum()
    out.insert(0, "time", pd.to_datetime(ts[0] + out.index.to_numpy() * width, unit="s"))
    return out.reset_index(drop=True)


def event_rate_figure(frame: pd.DataFrame) -> go.Figure:
    title = "Blocks stored (up) and removed (down)"
    if frame is None or frame.empty:
        return empty(title, "no KV event batches yet")
    b = binned(frame)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=b["time"], y=b["stored"], name="stored (BlockStored)",
                         marker_color=OKABE_ITO["green"],
                         hovertemplate="%{x}<br>%{y} blocks stored<extra></extra>"))
    fig.add_trace(go.Bar(x=b["time"], y=-b["removed"], name="removed (BlockRemoved)",
                         marker_color=OKABE_ITO["vermillion"], customdata=b["removed"],
                         hovertemplate="%{x}<br>%{customdata} blocks removed<extra></extra>"))
    for t in b.loc[b["cleared"] > 0, "time"]:
        fig.add_vline(x=t, line=dict(color=OKABE_ITO["black"], dash="dash", width=1.5))
    if (b["cleared"] > 0).any():          # a legend entry for the dashed lines
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="cache reset",
                                 line=dict(color=OKABE_ITO["black"], dash="dash")))
    fig.update_layout(barmode="relative", bargap=0.1)
    fig.update_yaxes(title="blocks", zeroline=True, zerolinecolor="#666666")
    return style(fig, title, height=300, legend_y=-0.25)


def cached_blocks_figure(frame: pd.DataFrame) -> go.Figure:
    title = "Cached blocks"
    if frame is None or frame.empty:
        return empty(title, "no KV event batches yet")
    fig = go.Figure()
    for rank, part in frame.groupby("rank"):
        fig.add_trace(go.Scatter(x=part["time"], y=part["cached"], mode="lines",
                                 line=dict(shape="hv", width=2.5, color=OKABE_ITO["blue"]
                                           if rank == 0 else None),
                                 name=f"rank {rank}", customdata=part["seq"],
                                 hovertemplate="%{x}<br>%{y} cached after batch %{customdata}"
                                               "<extra></extra>"))
    fig.update_yaxes(title="blocks", rangemode="tozero")
    return style(fig, title, height=300, legend_y=-0.25)
