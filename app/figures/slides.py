"""Slides: the run as a deck of slides in one self-contained HTML file (plotly.js inlined, so
it opens offline in any browser), one slide per step shown.

Each slide is the page's own figures (pool_grid, block_tables; cow where it copies; the Waste
tab's figure) at projector size
(``for_projector``: all text >= 18 px, their legends included) and the step's whole narration
as HTML text, which wraps instead of being cut. ← / → (or the buttons) move between slides.
A long run is thinned to at most ``MAX_SLIDES`` slides, evenly spaced, first and last always
kept, so a 400-step run stays a few MB; ``SlideDeck`` says how many slides and bytes before
the file is downloaded.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass

from app.figures.block_tables import block_table_figure
from app.figures.common import for_projector
from app.figures.cow import cow_figure
from app.figures.pool_grid import pool_figure
from app.figures.waste import waste_figure

MAX_SLIDES = 120


def thin(snapshots, limit: int = MAX_SLIDES) -> list:
    """At most ``limit`` snapshots, evenly spaced, the first and the last included."""
    snaps = list(snapshots)
    if len(snaps) <= limit:
        return snaps
    picks = sorted({round(i * (len(snaps) - 1) / (limit - 1)) for i in range(limit)})
    return [snaps[i] for i in picks]


@dataclass(frozen=True)
class SlideDeck:
    html: str
    slides: int          # slides in the deck
    steps: int           # snapshots it was made from

    @property
    def size_bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def summary(self) -> str:
        thinned = (f" (every {self.steps / self.slides:.1f}th of {self.steps} snapshots: long "
                   f"runs are thinned to {MAX_SLIDES})" if self.slides < self.steps else "")
        return f"{self.slides} slides{thinned}, {self.size_bytes / 2**20:.1f} MB"


def _figure_json(fig) -> dict:
    return json.loads(fig.to_json())


def slides_deck(snapshots, decode=None, narration=None,
                title: str = "PagedAttention Lab", questions=()) -> SlideDeck:
    """The deck; ``narration(snapshot) -> str`` (optional) is each slide's text;
    ``questions``: (what to watch, the question or None) of a lesson, a slide of their own
    after the first, to ask the class. A slide with copy-on-write also shows the copies, and
    each slide the Waste tab's figure (the same requests on contiguous slabs)."""
    snaps = list(snapshots)
    if not snaps:
        raise ValueError("no snapshots to export")
    chosen = thin(snaps)
    position = {id(s): i for i, s in enumerate(snaps)}
    slides = []
    for snap in chosen:
        i = position[id(snap)]
        prev = snaps[i - 1] if i > 0 else None
        slide = {
            "step": snap.step, "kind": snap.kind,
            "text": html.escape(narration(snap)) if narration is not None else "",
            "pool": _figure_json(for_projector(pool_figure(snap, decode, show_moves=True))),
            "tables": _figure_json(for_projector(block_table_figure(snap, decode)))}
        if any(e.kind == "cow" for e in snap.events):
            slide["cow"] = _figure_json(for_projector(cow_figure(snap, prev)))
        if snap.accounting:
            slide["waste"] = _figure_json(for_projector(waste_figure(snap, snaps[:i + 1])))
        slides.append(slide)
    if questions:
        items = "".join(f"<li>{html.escape(text)}" + (f"<br><b>Q: {html.escape(q)}</b>" if q
                                                        else "") + "</li>"
                        for text, q in questions)
        slides.insert(min(1, len(slides)), {"step": chosen[0].step, "kind": "lesson",
                                            "text": f"<ol>{items}</ol>"})
    from plotly.offline import get_plotlyjs
    data = json.dumps(slides, separators=(",", ":")).replace("</", "<\\/")
    page = _TEMPLATE.format(title=html.escape(title), plotlyjs=get_plotlyjs(), slides=data,
                            total=len(slides))
    return SlideDeck(page, len(slides), len(snaps))


_TEMPLATE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
  body {{font-family: "Source Sans Pro", Arial, sans-serif; margin: 0; padding: 12px 20px;
         color: #222;}}
  header {{display: flex; align-items: center; gap: 14px; font-size: 22px;}}
  header h1 {{font-size: 26px; margin: 0; flex: 1;}}
  button {{font-size: 20px; padding: 4px 14px;}}
  #text {{font-size: 22px; line-height: 1.35; background: #eef4fb; color: #1a4b8c;
          padding: 10px 14px; margin: 10px 0; border-radius: 6px;}}
  #figs, #figs2 {{display: flex; gap: 12px;}}
  #figs > div, #figs2 > div {{flex: 1; min-width: 0;}}
  #text ol {{margin: 4px 0;}} #text li {{margin: 6px 0;}}
</style>
<script>{plotlyjs}</script></head>
<body>
<header><h1>{title}</h1>
  <button id="prev" title="previous slide (←)">◀</button>
  <span id="where">slide 1 of {total}</span>
  <button id="next" title="next slide (→)">▶</button></header>
<div id="text"></div>
<div id="figs"><div id="tables"></div><div id="pool"></div></div>
<div id="figs2" class="row"><div id="cow"></div><div id="waste"></div></div>
<script>
const SLIDES = {slides};
let at = 0;
const CONFIG = {{displaylogo: false, responsive: true}};
function show(i) {{
  at = Math.max(0, Math.min(SLIDES.length - 1, i));
  const s = SLIDES[at];
  document.getElementById("where").textContent =
    `slide ${{at + 1}} of ${{SLIDES.length}} · step ${{s.step}} (${{s.kind}})`;
  document.getElementById("text").innerHTML = s.text || `Step ${{s.step}}`;
  for (const id of ["tables", "pool", "cow", "waste"]) {{
    const el = document.getElementById(id);
    if (s[id]) {{ el.style.display = ""; Plotly.react(id, s[id].data, s[id].layout, CONFIG); }}
    else {{ Plotly.purge(el); el.style.display = "none"; }}
  }}
}}
document.getElementById("prev").onclick = () => show(at - 1);
document.getElementById("next").onclick = () => show(at + 1);
document.addEventListener("keydown", (e) => {{
  if (e.key === "ArrowRight" || e.key === " ") {{ e.preventDefault(); show(at + 1); }}
  if (e.key === "ArrowLeft") {{ e.preventDefault(); show(at - 1); }}
}});
show(0);
</script></body></html>
"""
