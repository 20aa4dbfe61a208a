"""One Streamlit defect a visitor can reach (issue 45): an integer number_input converts the
value it is sent with ``int(val)`` before checking it, so a value of infinity or NaN sent over
the websocket (no browser sends one) raises OverflowError in Streamlit's own callback step,
before the page's code runs, on that run and on every later run of the session. Patched once
per process: such a value deserializes as the widget's default (None on the sidebar's number
fields, app/views/settings_form.py), as Streamlit already does for a float field, and the
page's check (app/widget_checks.py) names the field."""
from __future__ import annotations

import math


def install() -> None:
    from streamlit.elements.widgets import number_input
    serde = number_input.NumberInputSerde
    if getattr(serde, "_lab_finite_only", False):
        return
    original = serde.deserialize

    def deserialize(self, ui_value):
        if isinstance(ui_value, float) and not math.isfinite(ui_value):
            return self.value
        return original(self, ui_value)

    serde.deserialize = deserialize
    serde._lab_finite_only = True
