"""Bidi controls shown, not obeyed: a U+202E (right-to-left override) in a prompt reverses
every label drawn after it ("P8" read as "8P" in the Text view). In labels and messages each
control is replaced by a visible escape ("\\u202e"); the engine still gets the prompt as typed."""
from __future__ import annotations

import re

# embeddings and overrides, isolates, the marks, the Arabic letter mark
BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_BIDI = re.compile(f"[{BIDI_CONTROLS}]")


def visible_bidi(text: str) -> str:
    """``text`` with each bidi control written as its escape, e.g. "\\u202e"."""
    return _BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
