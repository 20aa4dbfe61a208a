"""Our engine (``engine.Engine``) as the page's engine (app/page_engine.py): what it offers
the page, read from the engine's public methods and snapshots."""
from __future__ import annotations

from operator import attrgetter

from engine import Engine


def _engines(name: str) -> property:
    """The wrapped engine's own attribute or method, unchanged (``Engine`` already has what
    the protocol asks for, under the same names)."""
    return property(attrgetter(f"engine.{name}"), doc=f"``Engine.{name}``")


class OurPageEngine:
    is_real_vllm = False
    lockstep = None                        # nothing runs beside it (the Compare tab builds
    startup_s = None                       # its partner itself: app/compare.py)
    cache_view = None                      # its KV events are on the Watch tab's publisher

    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def version(self) -> str:
        return self.engine.semantics.label

    config = _engines("config")
    semantics = _engines("semantics")
    tokenizer = _engines("tokenizer")
    max_model_len = _engines("max_model_len")
    history = _engines("history")
    snapshot = _engines("snapshot")
    step_no = _engines("step_no")
    event_counts = _engines("event_counts")
    num_finished = _engines("num_finished")
    # methods, bound to the engine
    tokenize = _engines("tokenize")
    decode_tokens = _engines("decode_tokens")
    check_request = _engines("check_request")
    add_request = _engines("add_request")
    has_unfinished_requests = _engines("has_unfinished_requests")
    step = _engines("step")
    close = _engines("close")
