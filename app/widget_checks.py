"""What a widget's value may be, checked where it arrives (issue 45): a browser sends what its
widget allows, but anybody can send any value over Streamlit's websocket (a scenario "nope", an
Engine "v9", a seed of -1, an infinite temperature). One function per kind of widget says why
a value cannot be used, in the widget's label, so a value sent around the widget gets the same
message as one typed into it. Nothing here imports Streamlit (app/views/widget_guard.py calls
these at the edge of every run)."""
from __future__ import annotations

import math

INT64 = (-(2 ** 63), 2 ** 63 - 1)
# vLLM's SamplingParams takes a seed in [0, 2**63) (a torch.Generator seed); the lab's engine
# follows it
INT_RANGES = {"seed": (0, 2 ** 63 - 1)}
MAX_TEXT_CHARS = 20_000              # the prompts field (one request per line)


def show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def choice_problem(label: str, value, options) -> str | None:
    if value in options and type(value) in {type(o) for o in options}:
        return None
    return f"{label}: {show(value)} is not one of its choices"


def bool_problem(label: str, value) -> str | None:
    return None if isinstance(value, bool) else f"{label} must be on or off, got {show(value)}"


def text_problem(label: str, value, max_chars: int = MAX_TEXT_CHARS) -> str | None:
    if not isinstance(value, str):
        return f"{label} must be text, got {show(value)}"
    if len(value) > max_chars:
        return f"{label} is {len(value):,} characters long: at most {max_chars:,}"
    return None


def number_problem(label: str, value, *, integer: bool, bounds=INT64,
                   none_ok: bool = False) -> str | None:
    """A number field's value: a finite number; a whole one in ``bounds`` if ``integer``."""
    if value is None and none_ok:
        return None
    if value is None:                    # what Streamlit leaves of 1e309 or of an empty field
        return (f"{label} must be a finite number: the field is empty or its value (such as "
                "1e309) is not one")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{label} must be a number, got {show(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{label} must be a finite number, got {value}"
    if not integer:
        return None
    if isinstance(value, float) and not value.is_integer():
        return f"{label} must be a whole number, got {value:g}"
    lo, hi = bounds
    if not lo <= int(value) <= hi:
        return f"{label} must be a whole number from {lo:,} to {hi:,}, got {int(value):,}"
    return None


def drawable_problem(row, value) -> str | None:
    """Why the sidebar cannot even show ``value`` in setting ``row``'s widget (a type or a
    choice it never offers), or None. Checked on every run."""
    if row.widget in ("radio", "selectbox"):
        return choice_problem(row.label, value, row.options)
    if row.widget == "checkbox":
        return bool_problem(row.label, value)
    if row.widget in ("text_area", "model"):
        return text_problem(row.label, value)
    if row.widget == "number" and (value is None or isinstance(value, bool)
                                    or not isinstance(value, (int, float))):
        return number_problem(row.label, value, integer=row.integer,
                              none_ok=row.zero_is_none)
    return None


def setting_problem(row, value) -> str | None:
    """Why setting ``row`` cannot run with ``value`` (typed or sent), or None: checked on Apply,
    before the engine sees it, as vLLM checks its own arguments."""
    if row.widget == "number":
        return number_problem(row.label, value, integer=row.integer,
                              bounds=INT_RANGES.get(row.name, INT64), none_ok=row.zero_is_none)
    return drawable_problem(row, value)
