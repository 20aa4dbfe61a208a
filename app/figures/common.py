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


# plotly_white's layout part, built once: naming "plotly_white" on every figure makes Plotly
# validate and copy the whole template (with every trace type's defaults) and send it with each
# figure (~6 KB), which was most of a figure's build time on the page.
WHITE_TEMPLATE = go.layout.Template(layout=dict(
    autotypenumbers="strict", font=dict(color="#2a3f5f"), hovermode="closest",
    hoverlabel=dict(align="left"), paper_bgcolor="white", plot_bgcolor="white",
    colorway=["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692",
              "#B6E880", "#FF97FF", "#FECB52"], title=dict(x=0.05),
    **{axis: dict(gridcolor="#EBF0F8", linecolor="#EBF0F8", zerolinecolor="#EBF0F8", ticks="",
                  title=dict(standoff=15), automargin=True, zerolinewidth=2)
       for axis in ("xaxis", "yaxis")}))


def layout(title: str, height: int | None = None, legend_y: float = -0.02, **extra) -> dict:
    """The shared layout (title, fonts, template, legend below) as a plain dict."""
    out = dict(title=dict(text=title, font=dict(size=FONT_SIZE + 2)), font=dict(size=FONT_SIZE),
               template=WHITE_TEMPLATE, margin=dict(l=10, r=10, t=50, b=10),
               hoverlabel=dict(font_size=FONT_SIZE),
               legend=dict(orientation="h", yanchor="top", y=legend_y, x=0))
    if height:
        out["height"] = height
    out.update(extra)
    return out


MAX_ID_CHARS = 16


def short_id(request_id: str) -> str:
    """A request id short enough for a row label: a server's ids ("cmpl-<16 hex>-0-<8 hex>")
    took most of a narrow plot's width, leaving the cells too narrow for their labels; the
    row's seq id keeps it unique, the hover names the whole id."""
    rid = str(request_id)
    return rid if len(rid) <= MAX_ID_CHARS else f"{rid[:10]}…{rid[-5:]}"


def tick_margin(labels, px_per_char: float = 6.5) -> int:
    """A left margin that fits the longest tick label (Plotly's automargin would
    measure it, at the price of drawing the figure twice)."""
    longest = max((len(str(t)) for t in labels), default=0)
    return int(16 + px_per_char * longest)


def make_figure(traces: list[dict], layout_dict: dict) -> go.Figure:
    """One go.Figure from plain trace and layout dicts, for the figures the page redraws on
    every Step. Plotly does not validate them here: validation was half of building the pool
    figure (6.1 -> 1.9 ms per figure, measured; issue 29's server budget per click is ~30 ms).
    tests/app/test_figures.py validates every such figure of every preset with Plotly instead
    (``test_every_step_figure_passes_plotlys_validation``)."""
    return go.Figure(data=traces, layout=layout_dict, _validate=False)


def style(fig: go.Figure, title: str, height: int | None = None, legend_y: float = -0.02
          ) -> go.Figure:
    fig.update_layout(layout(title, height, legend_y))
    return fig


# The narrowest plot a figure gets: half of the main area at 1280x720 (the Memory tab's two
# columns with the sidebar open; the projector's right column split in two is about the same)
NARROW_PX = 440
CHAR_EM = 0.62                          # a character's mean width, in font sizes (Open Sans)


def wrap(text: str, chars: int) -> str:
    """``text`` in lines of at most ``chars`` characters, joined by <br> (Plotly does not wrap)."""
    import textwrap
    return "<br>".join(textwrap.wrap(text, chars)) or text


def empty(title: str, message: str, height: int = 220) -> go.Figure:
    # wrapped for the narrowest column at projector size, or both ends are cut (issue 38)
    chars = int(NARROW_PX / (CHAR_EM * PROJECTOR_MIN_FONT))
    return make_figure([], layout(
        title, height, xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=wrap(message, chars), showarrow=False, x=0.5, y=0.5,
                          xref="paper", yref="paper",
                          font=dict(size=FONT_SIZE + 1, color="#555"))]))


def fit_cell_labels(labels: list[list[str]], cell_px: float, font: float) -> list[list[str]]:
    """Cell labels that fit a cell ``cell_px`` wide at ``font`` px: a label too wide is cut to
    its first word ("P17 ×3" -> "P17"), and to nothing (the hover keeps it) if that is still
    too wide; overlapping labels read as one unreadable string (issue 38)."""
    fits = max(0, int((cell_px - 6) / (CHAR_EM * font)))

    def plain(t: str) -> str:
        return t.replace("<b>", "").replace("</b>", "")

    def fit(t: str) -> str:
        if len(plain(t)) <= fits:
            return t
        short = t.split(" ", 1)[0]
        return short if len(plain(short)) <= fits else ""
    return [[fit(t) for t in row] for row in labels]


def legend_note(entries: list[tuple[str, str]], per_line: int = 3, right: bool = False
                ) -> tuple[dict, int]:
    """A legend as one annotation under the plot -- a coloured ■ before each label -- and the
    bottom margin it needs. Legend entries drawn as empty swatch traces cost Chromium about
    75 ms more per Step (a trace each, and the legend re-pushing the margins), for the figures
    the page redraws on every step. ``right`` ends it at the plot's right edge (for a narrow
    plot with a wide left margin)."""
    marks = [(f'<span style="color:#888;font-size:20px">□</span>' if color == FREE_GREY else
              f'<span style="color:{color};font-size:20px">■</span>') + f" {html.escape(label)}"
             for label, color in entries]
    # at most ``per_line`` entries, and no more characters than the narrowest column holds at
    # projector size: a longer line is cut at the figure's edge (issue 38)
    budget = int(NARROW_PX / (CHAR_EM * PROJECTOR_MIN_FONT))
    lines, line, used = [], [], 0
    for mark, (label, _) in zip(marks, entries):
        width = len(label) + 2 + (3 if line else 0)
        if line and (len(line) == per_line or used + width > budget):
            lines.append("   ".join(line))
            line, used, width = [], 0, len(label) + 2
        line.append(mark)
        used += width
    if line:
        lines.append("   ".join(line))
    note = dict(text="<br>".join(lines), name="legend", showarrow=False, xref="paper",
                yref="paper", x=1 if right else 0, y=0, xanchor="right" if right else "left",
                yanchor="top", yshift=-6, align="right" if right else "left",
                font=dict(size=FONT_SIZE - 1))
    return note, 16 + 26 * len(lines)


def discrete_colorscale(colors: list[str]) -> list:
    """A stepped colorscale: z = i + 0.5 (with zmin 0, zmax len) gets colors[i]."""
    k = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale


PROJECTOR_MIN_FONT = 18       # px: figure text read from the back of a room at 1280x720
_FONT_KEYS = ("font", "textfont", "tickfont", "insidetextfont", "outsidetextfont")


def for_projector(fig: go.Figure, minimum: int = PROJECTOR_MIN_FONT) -> go.Figure:
    """A copy of ``fig`` whose every text (titles, ticks, legends, annotations, cell labels)
    is at least ``minimum`` px: the projector layout's figures (the page's builders are
    sized for a screen read from close by)."""
    d = fig.to_dict()

    def raise_fonts(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _FONT_KEYS and isinstance(value, dict):
                    size = value.get("size")
                    if size is None or (isinstance(size, (int, float)) and size < minimum):
                        value["size"] = minimum
                raise_fonts(value)
        elif isinstance(node, list):
            for item in node:
                raise_fonts(item)

    layout_dict = d.setdefault("layout", {})
    layout_dict.setdefault("font", {})
    for axis in [k for k in layout_dict if k.startswith(("xaxis", "yaxis"))]:
        layout_dict[axis].setdefault("tickfont", {})
    raise_fonts(d)
    for trace in d.get("data", []):             # labels fitted to a cell (fit_cell_labels),
        meta = trace.get("meta")                # fitted again at the larger size
        if isinstance(meta, dict) and "cell_px" in meta and "labels" in meta:
            trace["text"] = fit_cell_labels(meta["labels"], meta["cell_px"] * meta.get(
                "projector_scale", 1.0), minimum)
        z = trace.get("z")                      # a grid too dense for 18 px labels (a pool of
                                                # hundreds of blocks) keeps them in the hover
        if trace.get("type") == "heatmap" and z and len(z) * len(z[0]) > 128:
            trace["texttemplate"] = ""
            trace.pop("text", None) if not trace.get("hovertemplate", "").count("%{text}") \
                else None
    title = layout_dict.get("title")
    if isinstance(title, dict):
        title.setdefault("font", {})["size"] = max(title.get("font", {}).get("size") or 0,
                                                   minimum + 4)
    # larger type needs a little more room, unless the figure's rows were sized for 18 px
    # text already (layout meta "rows_fit_projector": the block tables, so that at 1280x720
    # their legend stays on the first screen, issue 38)
    fits = isinstance(layout_dict.get("meta"), dict) and layout_dict["meta"].get(
        "rows_fit_projector")
    if "height" in layout_dict and not fits:
        layout_dict["height"] = int(layout_dict["height"] * 1.15)
    margin = layout_dict.get("margin", {})
    if margin.get("l", 0) > 30:                 # a margin sized for 12 px tick labels
        margin["l"] = int(margin["l"] * minimum / FONT_SIZE)
    return go.Figure(d)
