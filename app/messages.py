"""What the page says when something is refused or fails: the engine's words reworded with the
sidebar's labels (app/page_settings.py), server paths left out, unexpected failures in one
line with the traceback in the server's log."""
from __future__ import annotations

import logging
import re

from engine.sched.registry import SEMANTICS

from app import hosting
from app.failures import describe_failure
from app.page_settings import SETTINGS

log = logging.getLogger("app.messages")

# the engine's names (its Python API) -> the sidebar's labels, for messages shown on the page
PAGE_LABELS = {row.name: row.message_label for row in SETTINGS if row.message_label}
_API_NAME = re.compile(r"\b(" + "|".join(PAGE_LABELS) + r")\b")
_API_SEMANTICS = re.compile(r"""semantics\s*=\s*['"](\w+)['"]""")


def _engine_choice(m: re.Match) -> str:
    rules = SEMANTICS.get(m.group(1))
    return f"the Engine “{rules.label}”" if rules is not None else m.group(0)


def page_words(text: str) -> str:
    """``text`` with the engine's setting names replaced by the sidebar's labels (and an
    engine named as the API does, ``semantics='v0'``, as the Engine choice names it)."""
    return _API_NAME.sub(lambda m: PAGE_LABELS[m.group(1)], _API_SEMANTICS.sub(_engine_choice, text))


def page_message(exc: Exception) -> str:
    """What the page shows: a ValueError's reason (without server paths); for anything else a
    short line, with the traceback logged on the server."""
    if isinstance(exc, hosting.ModelNotOffered):
        return str(exc)                  # what the session typed, and the operator's list
    if isinstance(exc, ValueError):
        return page_words(hosting.public_message(str(exc)))
    log.error("unexpected error while building an engine", exc_info=exc)
    return unexpected_message(exc)


def unexpected_message(exc: BaseException) -> str:
    """One short line: the installed package a failure came from and the command that fixes
    it (app/failures.py), else that something went wrong (the traceback is in the log)."""
    described = describe_failure(exc)
    if described:
        return described
    return (f"Something went wrong on the server ({type(exc).__name__}); it was logged there. "
            "Try again, or change the settings.")
