"""Beam / fork tree: one horizontal line per sequence, from the step it was born to the step it
ended (or now); a diagonal joins a forked child to its parent. Survivors are solid, pruned beams
dashed with an ×, finished ones end in a star. Beam search: transformers' scoring, vLLM v0's
memory rules.
"""
from __future__ import annotations

import plotly.graph_objects as go

from app.figures.common import OKABE_ITO, empty, style

STATUS_STYLE = {   # colour, dash, end marker
    "running": (OKABE_ITO["blue"], "solid", "circle"),
    "finished": (OKABE_ITO["green"], "solid", "star"),
    "pruned": (OKABE_ITO["vermillion"], "dash", "x"),
    "waiting": ("#777777", "dot", "circle-open"),
    "swapped": (OKABE_ITO["purple"], "dot", "circle-open"),
}


def end_steps(snapshots, upto: int) -> dict[int, int]:
    """seq_id -> the step whose events finished or pruned it (only steps <= upto)."""
    ends = {}
    for snap in snapshots:
        if snap.step > upto:
            continue
        for e in snap.events:
            if e.kind in ("finish", "beam_prune"):
                ends.setdefault(e.seq_id, snap.step)
    return ends


def status_spans(snapshots, upto: int) -> dict[int, list[tuple[int, str]]]:
    """seq_id -> (step, status) at every recorded step <= upto."""
    spans: dict[int, list[tuple[int, str]]] = {}
    for snap in snapshots:
        if snap.step > upto:
            continue
        for s in snap.sequences:
            spans.setdefault(s.seq_id, []).append((snap.step, s.status))
    return spans


def _segments(points, start: int, end: int, status_now: str) -> list[tuple[int, int, str]]:
    """(from step, to step, status) pieces of a sequence's line; one piece in its status now
    where the history does not say more."""
    points = [(step, st) for step, st in (points or []) if start <= step <= end]
    if not points:
        return [(start, end, status_now)]
    out: list[list] = []
    for step, st in points:
        if out and out[-1][2] == st:
            out[-1][1] = step
        else:
            if out:
                out[-1][1] = step            # the line runs on to where the status changed
            out.append([step, step, st])
    out[-1][1] = max(out[-1][1], end)
    if out[0][0] > start:
        out[0][0] = start
    return [tuple(seg) for seg in out]


def tree_order(seqs) -> list:
    """Depth-first order (children right below their parent), per request."""
    children: dict[int | None, list] = {}
    ids = {s.seq_id for s in seqs}
    for s in seqs:
        parent = s.parent_seq_id if s.parent_seq_id in ids else None
        children.setdefault(parent, []).append(s)
    out = []

    def visit(s):
        out.append(s)
        # the latest-born child first, right under its parent: a fork's connector then passes
        # only rows whose lines start after it, so connectors never cross lines (issue 38)
        for c in sorted(children.get(s.seq_id, []), key=lambda c: (-c.born_step, c.seq_id)):
            visit(c)
    for root in sorted(children.get(None, []), key=lambda s: (s.request_id, s.seq_id)):
        visit(root)
    return out


def beam_tree_figure(snapshot, history=()) -> go.Figure:
    is_beam = any(s.is_beam for s in snapshot.sequences)
    title = ("Beam tree (transformers' scoring, vLLM v0 memory)" if is_beam else "Sequence tree (forks)") \
        + f" — step {snapshot.step}"
    seqs = tree_order(snapshot.sequences)
    if not seqs:
        return empty(title, "no sequences yet")
    ends = end_steps(history, snapshot.step)
    spans = status_spans(history, snapshot.step)
    row = {s.seq_id: i for i, s in enumerate(seqs)}
    fig = go.Figure()
    shown = set()
    for s in seqs:
        color, dash, symbol = STATUS_STYLE.get(s.status, ("#777777", "solid", "circle"))
        start = s.born_step
        end = ends.get(s.seq_id, snapshot.step)
        end = max(end, start)
        y = row[s.seq_id]
        if s.parent_seq_id in row:           # fork edge from the parent's line
            fig.add_trace(go.Scatter(x=[max(start - 1, 0), start], y=[row[s.parent_seq_id], y],
                                     mode="lines", line=dict(color="#999999", width=2),
                                     hoverinfo="skip", showlegend=False, name="fork"))
        tail = s.text[-24:].replace("\n", "↵") if s.text else ""
        hover = (f"seq {s.seq_id} (req {s.request_id}) · {s.status}"
                 + (f" ({s.finish_reason})" if s.finish_reason else "")
                 + f"<br>born step {start}, parent {s.parent_seq_id}"
                 + f"<br>cumulative logprob {s.cumulative_logprob:.2f}<br>…{tail}")
        # the line in the status the sequence had at each step (a request preempted after
        # running steps 1-8 is drawn running there, then waiting), its end in the status now
        # a pruned beam is a dead branch: its whole line in the pruned style the legend names
        # (its history says "running" up to the step that pruned it)
        segments = ([(start, end, "pruned")] if s.status == "pruned" else
                    _segments(spans.get(s.seq_id), start, end, s.status))
        for a, b, status in segments:
            seg_color, seg_dash, _ = STATUS_STYLE.get(status, ("#777777", "solid", "circle"))
            fig.add_trace(go.Scatter(
                x=[a, b], y=[y, y], mode="lines", name=status, legendgroup=status,
                showlegend=status not in shown, line=dict(color=seg_color, dash=seg_dash,
                                                          width=4),
                hovertext=[hover, hover], hoverinfo="text"))
            shown.add(status)
        fig.add_trace(go.Scatter(
            x=[start, end], y=[y, y], mode="markers", showlegend=False, legendgroup=s.status,
            marker=dict(symbol=["circle", symbol], size=[7, 15], color=color),
            hovertext=[hover, hover], hoverinfo="text", name=s.status))
        label = f"seq {s.seq_id}: …{tail}" if tail else f"seq {s.seq_id}"
        fig.add_annotation(x=end, y=y, text=label, showarrow=False, xanchor="left", xshift=12,
                           font=dict(size=15), name="seq-label")
    last = max(max(ends.values(), default=0), snapshot.step)
    fig.update_xaxes(title="step", range=[-0.5, last + 0.5 + max(3, 0.35 * (last + 1))])
    fig.update_yaxes(visible=False, autorange="reversed")
    return style(fig, title, height=170 + 30 * len(seqs), legend_y=-0.18)
