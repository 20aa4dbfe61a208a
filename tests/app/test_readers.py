"""Issue 38: what a newcomer, a teacher and a vLLM engineer found wrong on the page, one test
per finding that is state (AppTest) or a pure figure (its geometry read from the figure). The
layout findings are measured in Chromium in tests/app/test_browser_readers.py."""
from __future__ import annotations

import pytest

from app.lessons import LESSONS

from .conftest import needs_model
from .test_page import app, chart, lab, step  # noqa: F401  (fixture + helpers)

pytestmark = needs_model


def _lessons(at, key: str) -> None:
    at.radio(key="w_mode").set_value("Lessons").run()
    at.selectbox(key="w_lesson").set_value(key).run()
    assert not at.exception


def _next(at) -> None:
    at.button(key="lesson_next").click().run()
    assert not at.exception


# 1. a checkpoint's answer box starts empty, never with the previous checkpoint's answer
def test_answer_box_is_empty_at_each_new_checkpoint(app):
    at = app
    _lessons(at, "parallel")
    asked = 0
    for _ in range(len(LESSONS["parallel"].checkpoints)):
        if not [b for b in at.button if b.key == "lesson_next"]:
            break
        _next(at)
        boxes = [t for t in at.text_input if t.key == "w_lesson_answer"]
        if not boxes:
            continue
        assert boxes[0].value == "", f"checkpoint {lab(at)} box holds {boxes[0].value!r}"
        boxes[0].input("4").run()
        at.button(key="lesson_check").click().run()
        asked += 1
    assert asked >= 2


# ---- pure figures ----------------------------------------------------------------------------
def _curve(path: str, n: int = 60):
    """Points of a quadratic path "M x0,y0 Q cx,cy x1,y1" (the pool's arrows)."""
    import re
    x0, y0, cx, cy, x1, y1 = map(float, re.findall(r"-?\d+(?:\.\d+)?", path))
    pts = []
    for i in range(1, n):
        t = i / n
        pts.append(((1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t * t * x1,
                    (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1))
    return pts


# 6. copy-on-write arrows neither cross nor overlap each other, nor pass over a cell
@pytest.mark.parametrize("n", [3, 4, 6])
def test_cow_arrows_stay_off_cells_and_apart(n):
    from app.figures.pool_grid import pool_figure
    from engine import SamplingParams
    from .conftest import run_length_only
    eng, _ = run_length_only([list(range(1, 11))],
                             SamplingParams(n=n, temperature=1.0, max_tokens=4, ignore_eos=True),
                             3)
    snap = next(s for s in eng.history if any(e.kind == "cow" for e in s.events))
    fig = pool_figure(snap)
    arcs = [_curve(sh.path) for sh in fig.layout.shapes if sh.name == "cow"]
    assert len(arcs) == n - 1
    cols = 8
    for arc in arcs:
        for x, y in arc:
            for i in range(len(snap.blocks)):     # inside no cell (gaps of 3 px ignored)
                cx, cy = i % cols, i // cols
                assert not (abs(x - cx) < 0.45 and abs(y - cy) < 0.45), (x, y, i)
    for i, a in enumerate(arcs):
        for b in arcs[i + 1:]:
            gap = min(((xa - xb) ** 2 + (ya - yb) ** 2) ** 0.5 for xa, ya in a for xb, yb in b)
            assert gap > 0.04, f"two arrows touch (closest {gap:.3f} cells)"
    lo = fig.layout.yaxis.range[1]
    assert all(y > lo for arc in arcs for _, y in arc), "an arrow leaves the plot at the top"


# 2, 6. a legend line fits the narrowest column at projector size
def test_legend_lines_fit_the_narrowest_column(parallel_run):
    import re
    from app.figures.common import CHAR_EM, NARROW_PX, PROJECTOR_MIN_FONT
    from app.figures.block_tables import block_table_figure
    from app.figures.pool_grid import pool_figure
    eng, _ = parallel_run
    snap = next(s for s in eng.history if any(e.kind == "cow" for e in s.events))
    for fig in (pool_figure(snap), block_table_figure(snap)):
        note = next(a for a in fig.layout.annotations if a.name == "legend")
        for line in note.text.split("<br>"):
            plain = re.sub(r"<[^>]+>", "", line)
            assert len(plain) * CHAR_EM * PROJECTOR_MIN_FONT <= NARROW_PX, plain


# 7. pruned beams are drawn as the legend says, and no fork connector crosses a line
def _beam_history():
    from engine import SamplingParams
    from .conftest import run_length_only
    eng, _ = run_length_only([list(range(1, 8))],
                             SamplingParams(beam_width=4, max_tokens=10, ignore_eos=True), 10,
                             num_gpu_blocks=64)
    return eng.history


def test_pruned_beams_are_dashed_and_connectors_cross_nothing():
    from app.figures.beam_tree import STATUS_STYLE, beam_tree_figure
    history = _beam_history()
    checked = 0
    history = list(history)
    for snap in history[1:]:
        fig = beam_tree_figure(snap, history)
        lines = [t for t in fig.data if t.mode == "lines" and t.name != "fork"]
        pruned = {s.seq_id for s in snap.sequences if s.status == "pruned"}
        for t in lines:
            if t.hovertext and int(t.hovertext[0].split()[1]) in pruned:
                assert (t.line.dash, t.line.color) == STATUS_STYLE["pruned"][:2][::-1], t
                checked += 1
        for fork in (t for t in fig.data if t.name == "fork"):
            (x0, x1), (y0, y1) = fork.x, fork.y
            for t in lines:
                r = t.y[0]
                if min(y0, y1) < r < max(y0, y1):
                    x = x0 + (r - y0) / (y1 - y0) * (x1 - x0)
                    assert not (min(t.x) <= x <= max(t.x)), \
                        f"step {snap.step}: a fork connector crosses the line of row {r}"
    assert checked, "no pruned beam drawn"
