"""The settings form's widgets, drawn from the table of page settings (app/page_settings.py):
each row's widget, label, help and place; the rules of the chosen engine say which are off."""
from __future__ import annotations

from contextlib import nullcontext
from itertools import groupby

import streamlit as st

from app.page_settings import SETTINGS, Setting

_COLUMNS = ("left", "right")


def _draw(row: Setting, where, rules) -> None:
    kw = {"key": f"w_{row.name}"}
    if row.help_for(rules):
        kw["help"] = row.help_for(rules)
    if row.disabled is not None:
        kw["disabled"] = row.disabled(rules)
    if row.widget == "number":
        kw.update({k: v for k, v in (("step", row.step), ("format", row.format))
                   if v is not None})
        # Streamlit replaces a value it cannot use (1e309: not finite; beyond its bounds) by
        # the widget's default, so that default is None, never a number that then applies
        # unnoticed (issue 45): app/widget_checks.py names the field instead
        kw["value"] = None
        where.number_input(row.label, **kw)
    elif row.widget == "text_area":
        where.text_area(row.label, height=row.height, **kw)
    elif row.widget == "radio":
        where.radio(row.label, list(row.options), horizontal=True, **kw)
    elif row.widget == "checkbox":
        where.checkbox(row.label, **kw)
    elif row.widget == "selectbox":
        where.selectbox(row.label, list(row.options), **kw)
    else:
        raise ValueError(f"setting {row.name}: no widget {row.widget!r}")


def draw_settings(rules, custom) -> bool:
    """Every setting's widget, in the table's order: consecutive "left"/"right" rows in two
    columns, rows of one expander in it. ``custom[widget](row)`` draws a widget the page
    builds itself (the model field), returning False when the form must not apply."""
    ok = True
    for place, rows in groupby(SETTINGS, key=lambda r: "columns" if r.place in _COLUMNS
                               else r.place):
        rows = list(rows)
        if place == "columns":
            cols = dict(zip(_COLUMNS, st.columns(2)))
            for row in rows:
                _draw(row, cols[row.place], rules)
            continue
        with st.expander(place) if place != "form" else nullcontext():
            for row in rows:
                if row.widget in custom:
                    ok = custom[row.widget](row) and ok
                else:
                    _draw(row, st, rules)
    return ok

