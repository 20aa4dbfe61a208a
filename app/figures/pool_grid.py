"""The physical block pool: one cell per block, coloured by state, refcount written on the cell.

Device (GPU) blocks come first; the CPU swap pool, if any, is drawn below it. This step's
copy-on-write copies are arrows src -> dst; this step's swaps are arrows between the pools.
Hover a cell for its fill, owners, hash and the tokens it holds.
"""
from __future__ import annotations

import dataclasses

import plotly.graph_objects as go

from engine.core.block_math import cdiv
from app.figures.common import (COW_COLOR, STATE_COLORS, STATE_LABELS, SWAP_COLOR, block_label,
                                discrete_colorscale, empty, layout, legend_note, make_figure,
                                show_token, tick_margin, token_strings)

STATES = ("free", "used", "shared", "cached", "swapped", "null")
_CODE = {s: i for i, s in enumerate(STATES)}


def columns_for(num_blocks: int) -> int:
    return 8 if num_blocks <= 48 else 12 if num_blocks <= 144 else 16


def cell_state(block) -> str:
    if block.device == "cpu":
        return "swapped" if block.ref_count > 0 else "free"
    return block.state


def cell_text(block, block_size: int) -> str:
    label = block_label(block.block_id, block.device)
    if block.state == "null":
        return f"{label}<br>null"
    if block.ref_count == 0 and block.state != "cached":
        return label
    return f"<b>{label}</b><br>rc {block.ref_count}<br>{block.filled}/{block_size}"


def cell_hover(block, block_size: int, decode=None) -> str:
    lines = [f"<b>{block_label(block.block_id, block.device)}</b> ({cell_state(block)})",
             f"refcount {block.ref_count} · filled {block.filled}/{block_size} slots"]
    if block.seq_ids:
        lines.append(("held by seq " if len(block.seq_ids) == 1 else "held by seqs ")
                     + ", ".join(map(str, block.seq_ids)))
    if block.block_hash:
        lines.append(f"hash {block.block_hash[:12]}")
    if block.token_ids:
        toks = token_strings(block.token_ids, decode)
        lines.append("tokens: " + " | ".join(show_token(t) for t in toks))
    return "<br>".join(lines)


def _position(i: int, cols: int, row0: int = 0) -> tuple[int, int]:
    return i % cols, row0 + i // cols


def pool_figure(snapshot, decode=None, show_moves: bool = True, cpu_pool: bool = True
                ) -> go.Figure:
    """``cpu_pool=False`` leaves out a CPU swap pool that holds nothing (preemption by
    recompute never uses it): its empty rows pushed the GPU pool's legend below a 720-px
    screen (issue 38). A CPU pool holding a swapped-out block is always drawn."""
    title = f"Physical block pool — step {snapshot.step}"
    if not snapshot.blocks:
        return empty(title, "this snapshot holds no per-block detail")
    if not cpu_pool and not any(b.ref_count for b in snapshot.cpu_blocks):
        snapshot = dataclasses.replace(snapshot, cpu_blocks=())
    bs = snapshot.block_size
    cols = columns_for(len(snapshot.blocks))
    gpu_rows = cdiv(len(snapshot.blocks), cols)
    cpu_row0 = gpu_rows + 1                         # one empty row between the pools
    traces: list[dict] = []
    shapes: list[dict] = []
    annotations: list[dict] = []
    where: dict[tuple[str, int], tuple[int, int]] = {}
    for device, blocks, row0 in (("gpu", snapshot.blocks, 0), ("cpu", snapshot.cpu_blocks, cpu_row0)):
        if not blocks:
            continue
        rows = cdiv(len(blocks), cols)
        z = [[None] * cols for _ in range(rows)]
        text = [[""] * cols for _ in range(rows)]
        hover = [[""] * cols for _ in range(rows)]
        for i, b in enumerate(blocks):
            x, y = _position(i, cols)
            z[y][x] = _CODE[cell_state(b)] + 0.5
            text[y][x] = cell_text(b, bs)
            hover[y][x] = cell_hover(b, bs, decode)
            where[(device, b.block_id)] = (x, row0 + y)
        traces.append(dict(
            type="heatmap", z=z, x=list(range(cols)), y=list(range(row0, row0 + rows)), text=text,
            texttemplate="%{text}", textfont=dict(size=12), customdata=hover,
            hovertemplate="%{customdata}<extra></extra>", xgap=3, ygap=3, zmin=0,
            zmax=len(STATES), colorscale=discrete_colorscale([STATE_COLORS[s] for s in STATES]),
            showscale=False, name="GPU pool" if device == "gpu" else "CPU pool"))
    legend = [(STATE_LABELS[s], STATE_COLORS[s]) for s in STATES
              if (s != "swapped" or snapshot.cpu_blocks) and (s != "null" or snapshot.stats.null_blocks)]
    if show_moves:
        cows = [e for e in snapshot.events if e.kind == "cow"]
        for e in cows:
            # arrows leaving one block start side by side on its edge, nested like brackets
            # (the farthest outermost), so they never cross: leftward ones on the left
            same = sorted((c for c in cows if c.src == e.src), key=_lane_order(where))
            _arrow(shapes, annotations, where.get(("gpu", e.src)), where.get(("gpu", e.dst)),
                   COW_COLOR, "cow", lane=same.index(e), lanes=len(same))
        for e in snapshot.events:
            if e.kind in ("swap_out", "swap_in"):
                src_dev, dst_dev = ("gpu", "cpu") if e.kind == "swap_out" else ("cpu", "gpu")
                for src, dst in e.mapping:
                    _arrow(shapes, annotations, where.get((src_dev, src)),
                           where.get((dst_dev, dst)), SWAP_COLOR, "swap")
        if any(e.kind == "cow" for e in snapshot.events):
            legend.append(("copy-on-write src → dst (arrow)", COW_COLOR))
    cpu_rows = cdiv(len(snapshot.cpu_blocks), cols)
    ticks = list(range(gpu_rows)) + [cpu_row0 + r for r in range(cpu_rows)]
    # rows named by the blocks they hold ("P0–P7", "C0–C7"), not "GPU 8" (read as a device id)
    gpu, cpu = snapshot.blocks, snapshot.cpu_blocks
    labels = ([f"P{r * cols}–{min((r + 1) * cols, len(gpu)) - 1}" for r in range(gpu_rows)] +
              [f"C{r * cols}–{min((r + 1) * cols, len(cpu)) - 1}" for r in range(cpu_rows)])
    total_rows = gpu_rows + (1 + cpu_rows if cpu_rows else 0)
    st = snapshot.stats
    subtitle = (f"{st.total_blocks} blocks × {bs} slots · {st.used_blocks} used · "
                f"{st.shared_blocks} shared · {st.free_blocks} free"
                + (" · block 0 is v1's null block" if st.null_blocks else ""))
    note, bottom = legend_note(legend)
    return make_figure(traces, layout(
        f"{title}<br><sup>{subtitle}</sup>", height=100 + bottom + 62 * total_rows,
        # fixed margins, no automargin: Plotly's automargin pass redraws the figure again, which
        # was ~50 ms of Chromium's time per Step
        margin=dict(l=tick_margin(labels), r=10, t=50, b=bottom),
        yaxis=dict(automargin=False, range=[total_rows - 0.5, -1.35], tickmode="array", tickvals=ticks,
                   ticktext=labels, showgrid=False, zeroline=False),
        xaxis=dict(automargin=False, visible=False, range=[-0.5, cols - 0.5]),
        shapes=shapes, annotations=annotations + [note]))


def _lane_order(where):
    """Sort key of the copy-on-write arrows leaving one block: leftward nearest first, then
    rightward farthest first (outer arcs start outside the inner ones)."""
    def key(e):
        src, dst = where.get(("gpu", e.src)), where.get(("gpu", e.dst))
        if src is None or dst is None:
            return (2, 0)
        dx = (dst[0] - src[0]) + 100 * (dst[1] - src[1])    # another row: beyond this one
        return (0, abs(dx)) if dx < 0 else (1, -abs(dx))
    return key


def _arrow(shapes: list, annotations: list, src, dst, color: str, name: str, lane: int = 0,
           lanes: int = 1) -> None:
    """A curved arrow from cell ``src`` to cell ``dst``: within a row it arcs above the row,
    from the cell's top edge (never over a cell's text), higher the farther it goes, and arrows
    from one cell start side by side (``lane`` of ``lanes``), so they neither overlap each other
    nor the cells they pass; between rows it leaves the facing edges. ``name`` tags it
    ("cow" / "swap") for tests."""
    if src is None or dst is None:
        return
    (x0, y0), (x1, y1) = src, dst
    x0 += (lane - (lanes - 1) / 2) * (0.7 / max(lanes, 1))
    if y0 == y1:
        y0 = y1 = y0 - 0.5
        # height in proportion to length: arcs of one start then nest without meeting; a
        # quadratic curve peaks halfway to its control point, 0.77 cells for the longest,
        # inside the room the y range leaves above row 0
        cx, cy = (x0 + x1) / 2, y0 - 0.22 * min(abs(x1 - x0), 7)
    else:
        down = 0.42 if y1 > y0 else -0.42
        y0, y1 = y0 + down, y1 - down
        cx, cy = (x0 + x1) / 2 + 0.35, (y0 + y1) / 2
    shapes.append(dict(type="path", path=f"M {x0},{y0} Q {cx},{cy} {x1},{y1}", xref="x",
                       yref="y", line=dict(color=color, width=3), name=name, layer="above"))
    annotations.append(dict(x=x1, y=y1, ax=x1 + (cx - x1) * 0.3, ay=y1 + (cy - y1) * 0.3,
                            xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                            arrowhead=2, arrowsize=1.4, arrowwidth=3, arrowcolor=color, text="",
                            name=name))


def arrow_count(fig: go.Figure, name: str = "cow") -> int:
    """How many arrows of a kind the figure draws ("cow" or "swap")."""
    return sum(1 for sh in fig.layout.shapes if sh.name == name)
