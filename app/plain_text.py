"""Text from a visitor or a trace (file names, endpoints, model names, prompts, any field of an
uploaded trace), made safe to put in a Streamlit message: Streamlit renders every message as
Markdown, so a name like ``[Log in](https://evil.example)`` would become a live link. The one
helper every message goes through (docs/hosting.md#what-a-visitor-can-do).

``plain`` escapes what Markdown (CommonMark, GFM, Streamlit's ``$math$`` and ``:color[...]``)
would act on and leaves ordinary words as they are (a file name "mine.json" or a setting
"PAGED_LAB_MAX_TRACE_MB" reads the same), so it can wrap a whole message; bidi controls are
shown as escapes (app/bidi_text.py). ``plain_code`` is a code span no text can close."""
from __future__ import annotations

import re

from app.bidi_text import visible_bidi

# always escaped: links and images need [ ], raw HTML needs <, and the rest change what shows
_ALWAYS = re.compile(r"([\\`*\[\]{}<~$&@^|])")
_INTRAWORD_OK = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")   # a_b is never emphasis
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])(:)(?=//)|(?<=www)(\.)")   # http://x, www.x
_LINE_START = re.compile(r"^(\s*)([#>+=\-]|\d+(?=[.)]))")          # a heading, quote, list


def plain(text) -> str:
    """``text`` (anything: str() is taken) as literal text in a Markdown message, one line."""
    s = visible_bidi(str(text)).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    s = _ALWAYS.sub(r"\\\1", s)
    s = _INTRAWORD_OK.sub(r"\\_", s)
    s = _AUTOLINK.sub(lambda m: "\\" + (m.group(1) or m.group(2)), s)
    m = _LINE_START.match(s)
    if m:
        lead, mark = m.group(1), m.group(2)
        s = lead + ("\\" + mark if not mark[0].isdigit() else mark) + s[m.end():]
        if mark[0].isdigit():              # "1. x" would start a list: escape its dot
            s = lead + mark + "\\" + s[len(lead) + len(mark):]
    return s


def plain_code(text) -> str:
    """``text`` in a Markdown code span (shown as typed, monospaced): fenced by more backticks
    than any run inside it, so it cannot close the span early."""
    s = visible_bidi(str(text)).replace("\n", " ").replace("\r", " ")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", s)), default=0) + 1)
    return f"{fence} {s} {fence}"
