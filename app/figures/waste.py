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
PAGED_BY = {"vllm": "Paged (real vLLM)"}   # a snapshot's semantics -> its paged row's name


def allocator_label(allocator: str, snapshot=None) -> str:
    """An allocator's row name; the paged row names the engine whose pool it is (real vLLM's
    snapshots: "Paged (real vLLM)", issue 38), the baselines are modelled from its requests."""
    if allocator == "paged" and snapshot is not None and snapshot.semantics in PAGED_BY:
        return PAGED_BY[snapshot.semantics]
    return ALLOCATOR_LABELS.get(allocator, allocator)


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
    names = [allocator_label(a.allocator, snapshot)
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
        label = allocator_label(a.allocator, snapshot)
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


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def waste_headline(snapshot) -> str:
    """One sentence from the step's accounting: what the Max slab holds against paging."""
    acc = {a.allocator: a for a in snapshot.accounting}
    paged, worst = acc.get("paged"), acc.get("max")
    if paged is None:
        return ""
    held = paged.token_states + paged.internal_fragmentation
    paged_part = (f"paged holds {held} slots for {paged.token_states} tokens "
                  f"({_pct(paged.internal_fragmentation, held)} not yet filled: the rest of "
                  "last blocks, which the next tokens fill)")
    if worst is None:
        return paged_part[0].upper() + paged_part[1:] + "."
    slab = worst.token_states + worst.reserved + worst.internal_fragmentation
    if not slab:
        why = (f"{worst.rejected} request(s) can never fit its slabs" if worst.rejected
               else f"{worst.waiting} request(s) wait for a slab" if worst.waiting
               else "nothing is running")
        return f"Contiguous Max holds nothing ({why}); {paged_part}."
    same = "the same" if worst.token_states == paged.token_states else "its"
    return (f"Contiguous Max holds {slab} slots for {worst.token_states} tokens "
            f"({_pct(slab - worst.token_states, slab)} wasted: {worst.reserved} reserved for "
            f"future tokens, {worst.internal_fragmentation} never used); "
            + paged_part.replace(f"for {paged.token_states} tokens",
                                 f"for {same} {paged.token_states} tokens") + ".")


def request_table(snapshot):
    """Per request at this step: tokens in the KV cache, the paged slots it holds (its distinct
    blocks x block size) and each baseline's slab and waste (a pandas DataFrame)."""
    import pandas as pd

    bs = snapshot.block_size
    filled = {b.block_id: b.filled for b in snapshot.blocks}
    rows: dict[str, dict] = {}
    for s in snapshot.sequences:
        r = rows.setdefault(s.request_id, {"request": s.request_id, "blocks": set()})
        if s.device == "gpu" and s.status not in ("finished", "pruned"):
            r["blocks"].update(s.block_table)
    slabs = {(s.allocator, s.request_id): s for s in snapshot.slabs}
    out = []
    for rid, r in rows.items():
        row = {"request": rid, "tokens in cache": sum(filled.get(b, 0) for b in r["blocks"]),
               "paged slots": len(r["blocks"]) * bs,
               "paged not yet filled": len(r["blocks"]) * bs
               - sum(filled.get(b, 0) for b in r["blocks"])}
        for a in snapshot.accounting[1:]:
            slab = slabs.get((a.allocator, rid))
            name = ALLOCATOR_LABELS.get(a.allocator, a.allocator).replace("Contiguous ", "")
            # a slab stores the prompt once per sequence (n samples: n copies), which paging
            # shares: slab = tokens stored + wasted
            row[f"{name} slab"] = slab.size if slab else None
            row[f"{name} tokens stored"] = slab.token_states if slab else None
            row[f"{name} wasted"] = slab.wasted if slab else None
        out.append(row)
    return pd.DataFrame(out)


def request_table_long(snapshot):
    """``request_table`` one row per request and allocator (request, allocator, slots, tokens
    stored, empty slots, note): five columns fit the tab at 1280x720, where the wide table's
    twelve were cut ("Ora…", issue 38), and a slab not admitted says so instead of "None"."""
    import pandas as pd

    wide = request_table(snapshot)
    rows = []
    for r in wide.to_dict("records"):
        rows.append({"request": r["request"], "allocator": allocator_label("paged", snapshot),
                     "slots": r["paged slots"], "tokens stored": r["tokens in cache"],
                     "empty slots": r["paged not yet filled"],
                     "note": "last-block slots the next tokens fill"})
        for a in snapshot.accounting[1:]:
            label = ALLOCATOR_LABELS.get(a.allocator, a.allocator)
            name = label.replace("Contiguous ", "")
            slab = r.get(f"{name} slab")
            missing = slab is None or pd.isna(slab)
            rows.append({"request": r["request"], "allocator": label,
                         "slots": None if missing else int(slab),
                         "tokens stored": None if missing else int(r[f"{name} tokens stored"]),
                         "empty slots": None if missing else int(r[f"{name} wasted"]),
                         "note": "not admitted by this allocator at this step" if missing
                         else "reserved for future tokens or never used"})
    out = pd.DataFrame(rows)
    for col in ("slots", "tokens stored", "empty slots"):
        out[col] = out[col].astype("Int64")
    return out


def block_size_sweep_figure(frame, current_block_size: int | None = None) -> go.Figure:
    """Token-state share of allocated KV and mean running requests vs block size (from
    ``analysis.block_size_sweep``): small pages waste less, but every page size still beats a
    contiguous slab."""
    title = "Block-size sweep, same requests"
    if frame is None or len(frame) == 0:
        return empty(title, "no block size fits these requests")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("token states / allocated KV", "mean running requests"))
    x = list(frame["block_size"])
    fig.add_trace(go.Scatter(x=x, y=list(frame["token_state_share"]), mode="lines+markers",
                             name="token-state share", line=dict(color=OKABE_ITO["green"], width=3),
                             marker=dict(symbol="circle", size=9),
                             hovertemplate="block %{x}: %{y:.0%} token states<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(frame["mean_running_requests"]), mode="lines+markers",
                             name="running requests", line=dict(color=OKABE_ITO["blue"], width=3,
                                                                dash="dash"),
                             marker=dict(symbol="square", size=9),
                             hovertemplate="block %{x}: %{y:.2f} running<extra></extra>"),
                  row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", tickvals=x, ticktext=[str(v) for v in x], title="block size",
                         row=1, col=col)
        if current_block_size in x:
            fig.add_vline(x=current_block_size, line=dict(color="#777", dash="dot"), row=1, col=col)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    return style(fig, title, height=300, legend_y=-0.3)
