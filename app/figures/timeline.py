"""Event timeline: one lane per event kind, a dot per step sized by how many events it had."""
from __future__ import annotations

from collections import Counter

import plotly.graph_objects as go

from app.figures.common import OKABE_ITO, empty, style

KIND_ORDER = ("prefill", "alloc", "append", "sample", "fork", "cow", "prefix_hit", "cached",
              "evict", "preempt", "swap_out", "swap_in", "beam_prune", "finish", "free",
              "cache_reset")
_COLORS = list(OKABE_ITO.values())[1:] + ["#555555"]     # lanes are labelled: colour is a bonus
# what one event of a kind is, on its lane's label: a prefix hit is a block, while the metric
# strip counts prefix-cache hits in tokens (vLLM's counters); a lane says its unit (issue 38)
LANE_UNITS = {"alloc": "blocks", "free": "blocks", "cow": "blocks", "prefix_hit": "blocks",
              "cached": "blocks", "evict": "blocks", "append": "tokens", "sample": "tokens",
              "prefill": "sequences", "fork": "children", "preempt": "sequences",
              "swap_out": "sequences", "swap_in": "sequences", "beam_prune": "beams",
              "finish": "sequences"}


def lane_label(kind: str) -> str:
    unit = LANE_UNITS.get(kind)
    return f"{kind.replace('_', ' ')} ({unit})" if unit else kind.replace("_", " ")


def event_counts(snapshots) -> dict[str, dict[int, int]]:
    """{kind: {step: count}} over the snapshots, kinds in a fixed, readable order."""
    per_kind: dict[str, dict[int, int]] = {}
    for snap in snapshots:
        for kind, c in Counter(e.kind for e in snap.events).items():
            per_kind.setdefault(kind, {})[snap.step] = c
    order = {k: i for i, k in enumerate(KIND_ORDER)}
    return dict(sorted(per_kind.items(), key=lambda kv: order.get(kv[0], len(order))))


def timeline_figure(snapshots, current_step: int | None = None) -> go.Figure:
    title = "Event timeline"
    counts = event_counts(snapshots)
    if not counts:
        return empty(title, "no events yet: press Step")
    fig = go.Figure()
    for i, (kind, per_step) in enumerate(counts.items()):
        steps = sorted(per_step)
        n = [per_step[s] for s in steps]
        fig.add_trace(go.Scatter(
            x=steps, y=[lane_label(kind)] * len(steps), mode="markers+text", name=kind,
            showlegend=False,
            text=[str(c) for c in n], textposition="middle center",
            textfont=dict(size=12, color="black"),
            marker=dict(size=[min(34, 20 + 3 * c ** 0.5) for c in n],
                        color=_COLORS[KIND_ORDER.index(kind) % len(_COLORS)]
                        if kind in KIND_ORDER else "#555555", opacity=0.6,
                        line=dict(color="#333", width=1)),
            hovertemplate=f"step %{{x}}: %{{text}} {kind} event(s) · {lane_label(kind)}"
                          "<extra></extra>"))
    if current_step is not None:
        fig.add_vrect(x0=current_step - 0.3, x1=current_step + 0.3, layer="below", line_width=0,
                      fillcolor=OKABE_ITO["sky"], opacity=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=[lane_label(k) for k in counts][::-1])
    steps = [s.step for s in snapshots]
    fig.update_xaxes(title="step", dtick=1 if len(snapshots) <= 30 else None,
                     range=[min(steps) - 0.7, max(steps) + 0.7])
    return style(fig, title + (f" — showing step {current_step}" if current_step is not None else ""),
                 height=140 + 34 * len(counts))
