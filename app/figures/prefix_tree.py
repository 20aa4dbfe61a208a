"""The prefix cache as a tree: each cached block is a node, joined to the block it was chained
from (its parent hash). A path from a root is a prefix; where paths branch, requests shared the
blocks before the branch. Built only from KV cache events (engine.kv_events.CachedBlock), so it
draws a vLLM server's cache as well as this engine's.

Node size grows with the number of cached blocks that extend the node's prefix (how widely it is
shared); colour is how many times the hash was stored (re-stored after an eviction: > 1), in
three steps; the first hex digits of its hash name each node. A diamond is a block whose parent
is not cached: evicted before it, or stored before watching.
"""
from __future__ import annotations

import math
from collections import defaultdict

import plotly.graph_objects as go

from app.figures.common import OKABE_ITO, empty, style
from engine.kv_events.cache_view import CachedBlock
from engine.kv_events.wire import hash_hex

TITLE = "Prefix cache (blocks chained by parent hash)"
MAX_HOVER_TOKENS = 32
MAX_LABELLED = 60                       # nodes named on the figure; more keep it in the hover
STORES = {1: ("stored once", OKABE_ITO["sky"]), 2: ("stored twice", OKABE_ITO["orange"]),
          3: ("stored 3× or more", OKABE_ITO["vermillion"])}


def keep_newest(blocks: list[CachedBlock], max_blocks: int) -> list[CachedBlock]:
    """At most ``max_blocks``: the most recently stored ones, plus the cached ancestors that
    keep them connected to their roots."""
    if len(blocks) <= max_blocks:
        return blocks
    by_key = {b.key: b for b in blocks}
    kept: dict = {}
    for b in sorted(blocks, key=lambda b: b.seq, reverse=True):
        chain, seen = [], set()
        while b is not None and b.key not in kept and b.key not in seen:   # (a bad stream
            chain.append(b)                                                # may loop)
            seen.add(b.key)
            b = by_key.get(b.parent_key) if b.parent_key else None
        if len(kept) + len(chain) <= max_blocks:
            kept.update((c.key, c) for c in chain)
    return list(kept.values())


def tree_layout(blocks: list[CachedBlock]) -> dict:
    """key -> (depth, row, descendants, parent key or None): one row per leaf, a parent midway
    between its first and last child, roots in the order they were stored."""
    by_key = {b.key: b for b in blocks}
    children: dict = defaultdict(list)
    roots = []
    for b in blocks:
        if b.parent_key in by_key and b.parent_key != b.key:
            children[b.parent_key].append(b)
        else:
            roots.append(b)
    order = lambda b: (b.seq, hash_hex(b.block_hash))  # noqa: E731
    for kids in children.values():
        kids.sort(key=order)
    out: dict = {}
    seen: set = set()
    next_row = 0

    def place(root: CachedBlock) -> None:
        nonlocal next_row
        stack = [(root, 0, False)]          # iterative post-order: a long prompt is deep
        while stack:
            b, depth, expanded = stack.pop()
            if not expanded:
                if b.key in seen:
                    continue
                seen.add(b.key)
                kids = [c for c in children[b.key] if c.key not in seen]
                if kids:
                    stack.append((b, depth, True))
                    stack.extend((c, depth + 1, False) for c in reversed(kids))
                    continue
            placed = [out[c.key] for c in children[b.key] if c.key in out]
            if placed:
                rows = [p[1] for p in placed]
                row, below = (min(rows) + max(rows)) / 2, sum(1 + p[2] for p in placed)
            else:
                row, below = next_row, 0
                next_row += 1
            parent = b.parent_key if b.parent_key in by_key and b.parent_key != b.key else None
            out[b.key] = (depth, row, below, parent)

    for root in sorted(roots, key=lambda b: (b.rank, b.group, str(b.medium)) + order(b)):
        place(root)
    for b in sorted(blocks, key=order):     # parent hashes in a loop (a corrupt stream)
        if b.key not in seen:
            place(b)
    return out


def _hover(b: CachedBlock, below: int, has_parent: bool) -> str:
    parent = ("none (a first block)" if b.parent_hash is None else
              hash_hex(b.parent_hash)[:16] + ("" if has_parent else " (not cached)"))
    if b.token_ids is None:
        tokens = "not in the event"
    else:
        shown = " ".join(map(str, b.token_ids[:MAX_HOVER_TOKENS]))
        tokens = shown + (" …" if len(b.token_ids) > MAX_HOVER_TOKENS else "")
    return (f"block {hash_hex(b.block_hash)[:16]}<br>parent {parent}<br>"
            f"rank {b.rank} · {b.medium or 'medium ?'} · group {b.group} · {b.block_size} tokens"
            f"<br>stored in batch {b.seq}, {b.stores}× so far<br>"
            f"{below} cached block{'s' if below != 1 else ''} extend this prefix"
            f"<br>tokens: {tokens}")


ROW_PX, FRAME_PX = 18, 120                # a row of nodes; title, axis and legend around them


def prefix_tree_figure(blocks, max_blocks: int = 400, height: int | None = None) -> go.Figure:
    """``height`` None: the figure grows with its rows (280–900 px). A fixed ``height`` is for
    a view that redraws as batches arrive (the Watch tab): the figure never changes size, so
    nothing below it moves on the screen (issue 38, finding 16); rows keep their place from the
    top, and are drawn closer together only once they no longer fit."""
    blocks = list(blocks)
    if not blocks:
        return empty(TITLE, "no cached blocks yet: waiting for BlockStored events",
                     **({} if height is None else {"height": height}))
    shown = keep_newest(blocks, max_blocks)
    title = TITLE + (f" — newest {len(shown)} of {len(blocks)} blocks" if len(shown) < len(blocks)
                     else f" — {len(blocks)} blocks")
    layout = tree_layout(shown)
    by_key = {b.key: b for b in shown}
    ex, ey = [], []
    for key, (depth, row, _, parent) in layout.items():
        if parent is not None:
            pd_, pr = layout[parent][:2]
            ex += [pd_, depth, None]
            ey += [pr, row, None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#999999", width=1.5),
                             hoverinfo="skip", showlegend=False, name="parent"))
    # a count is drawn in steps, not on a continuous colour bar (1.5 stores means nothing:
    # issue 38); each step is a legend entry, and the shape says whether the parent is cached
    label_nodes = len(layout) <= MAX_LABELLED
    for orphan in (False, True):
        for stores, (what, color) in STORES.items():
            keys = [k for k, v in layout.items()
                    if (by_key[k].parent_hash is not None and v[3] is None) == orphan
                    and min(by_key[k].stores, max(STORES)) == stores]
            if not keys:
                continue
            fig.add_trace(go.Scatter(
                x=[layout[k][0] for k in keys], y=[layout[k][1] for k in keys],
                mode="markers+text" if label_nodes else "markers",
                # the hash's first hex digits on the node: a block is named without hovering
                text=[hash_hex(by_key[k].block_hash)[:6] for k in keys],
                textposition="top center", textfont=dict(size=11, color="#333"),
                name=(f"{what}, parent not cached" if orphan else what),
                marker=dict(symbol="diamond" if orphan else "circle",
                            size=[min(34, 9 + 4 * math.sqrt(layout[k][2])) for k in keys],
                            color=color, line=dict(color="#333333", width=1)),
                customdata=[hash_hex(by_key[k].block_hash) for k in keys],
                hovertext=[_hover(by_key[k], layout[k][2], layout[k][3] is not None)
                           for k in keys],
                hoverinfo="text"))
    rows = max(v[1] for v in layout.values()) + 1
    depth = max(v[0] for v in layout.values())
    fig.update_xaxes(title="block position in the prefix (0 = first block)", dtick=1,
                     range=[-0.4, depth + 0.4])
    if height is None:
        fig.update_yaxes(visible=False, autorange="reversed")
        return style(fig, title, height=int(min(900, max(280, FRAME_PX + ROW_PX * rows))),
                     legend_y=-0.2)
    fit = max(1, (height - FRAME_PX) // ROW_PX - 1)            # rows the height holds at ROW_PX
    # -1.6 at the top: room for row 0's labels, drawn above their nodes
    fig.update_yaxes(visible=False, range=[max(rows, fit) - 0.5, -1.6])
    return style(fig, title, height=height, legend_y=-0.2)
