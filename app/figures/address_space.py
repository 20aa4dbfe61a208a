"""The KV memory as a line of slots: the paged pool beside each contiguous baseline's address space.

One strip per allocator, all on the same slot scale (slot 0 .. pool capacity):
- paged: the pool's blocks in id order, each ``block_size`` slots: filled slots (token states),
  the unfilled slots of allocated blocks (its only waste: last-block slack), free blocks;
- each contiguous baseline (Max / Pow2 / Oracle): every running request's slab at its offset --
  ``[tok][tok][tok][reserved][reserved][never used]`` -- and the holes between slabs, drawn as
  external fragmentation while a request waits that none of them can hold, else as free.
Hover shows the request (or block), start and size. Pure: snapshot -> Figure; every number is
the engine's (``snapshot.blocks``, ``snapshot.slabs``, ``snapshot.accounting``).
"""
from __future__ import annotations

import plotly.graph_objects as go

from app.figures.common import FREE_GREY, OKABE_ITO, empty, style
from app.figures.waste import allocator_label

SEGMENTS = {   # kind -> (legend label, colour, pattern: colour is never the only carrier)
    "token": ("token states", OKABE_ITO["green"], ""),
    "reserved": ("reserved (future tokens)", OKABE_ITO["yellow"], "/"),
    "unfilled": ("paged: last-block slots not yet filled", OKABE_ITO["sky"], "+"),
    "internal": ("internal fragmentation (never used)", OKABE_ITO["orange"], "x"),
    "external": ("external fragmentation (hole too small)", OKABE_ITO["vermillion"], "."),
    "free": ("free", FREE_GREY, ""),
    "null": ("v1 null block (never used)", "#9E9E9E", "x"),
}


def _paged_segments(snapshot) -> list[tuple]:
    """(kind, start, length, hover) runs of the paged pool laid out block after block."""
    bs = snapshot.block_size
    out = []
    for b in snapshot.blocks:
        start = b.block_id * bs
        owners = ", ".join(map(str, b.seq_ids)) or "-"
        if b.state == "null":
            out.append(("null", start, bs, f"block P{b.block_id}: vLLM v1's null block"))
            continue
        if b.ref_count == 0:
            out.append(("free", start, bs, f"block P{b.block_id}: free"))
            continue
        where = f"block P{b.block_id} (seqs {owners}), slots {start}-{start + bs - 1}"
        out.append(("token", start, b.filled, f"{where}: {b.filled} token states"))
        if b.filled < bs:
            # the next tokens fill these (the headline's "not yet filled"); a slab's internal
            # fragmentation is never used: not the same kind (issue 38)
            out.append(("unfilled", start + b.filled, bs - b.filled,
                        f"{where}: {bs - b.filled} slots not yet filled in its last block"))
    return [seg for seg in out if seg[2] > 0]


def _baseline_segments(snapshot, allocator: str, capacity: int, external: bool) -> list[tuple]:
    out, end = [], 0
    slabs = sorted((s for s in snapshot.slabs if s.allocator == allocator), key=lambda s: s.start)
    hole = "external" if external else "free"
    for s in slabs:
        if s.start > end:
            out.append((hole, end, s.start - end, f"hole: slots {end}-{s.start - 1} "
                                                  f"({s.start - end} slots)"))
        where = f"request {s.request_id}: slab at slot {s.start}, {s.size} slots"
        at = s.start
        for kind, n in (("token", s.token_states), ("reserved", s.reserved),
                        ("internal", s.internal_fragmentation)):
            if n:
                out.append((kind, at, n, f"{where}; {n} {SEGMENTS[kind][0]}"))
            at += n
        end = s.start + s.size
    if end < capacity:
        out.append((hole, end, capacity - end, f"hole: slots {end}-{capacity - 1} "
                                               f"({capacity - end} slots)"))
    return out


def address_space_figure(snapshot) -> go.Figure:
    title = f"KV memory as slots: paged pool vs contiguous slabs — step {snapshot.step}"
    if not snapshot.accounting or not snapshot.blocks:
        return empty(title, "no detailed snapshot")
    capacity = snapshot.stats.token_capacity
    rows = [("paged", _paged_segments(snapshot))]
    for a in snapshot.accounting[1:]:
        rows.append((a.allocator, _baseline_segments(snapshot, a.allocator, capacity,
                                                     a.external_fragmentation > 0)))
    labels = {a: allocator_label(a, snapshot) for a, _ in rows}
    fig = go.Figure()
    for kind, (label, color, pattern) in SEGMENTS.items():
        segs = [(labels[a], start, n, hover) for a, row in rows for k, start, n, hover in row
                if k == kind]
        fig.add_trace(go.Bar(
            y=[s[0] for s in segs], x=[s[2] for s in segs], base=[s[1] for s in segs],
            orientation="h", name=label, customdata=[s[3] for s in segs],
            marker=dict(color=color, line=dict(color="#444", width=0.6),
                        pattern=dict(shape=pattern, fgcolor="#333", size=6)),
            hovertemplate="%{customdata}<extra></extra>", showlegend=True))
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_yaxes(autorange="reversed", categoryorder="array",
                     categoryarray=[labels[a] for a, _ in rows])
    fig.update_xaxes(title=f"KV slot (0 – {capacity - 1}; the paged pool's blocks are "
                           f"{snapshot.block_size} slots each)", range=[0, capacity])
    return style(fig, title, height=320, legend_y=-0.35)
