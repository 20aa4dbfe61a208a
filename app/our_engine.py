"""Our engine (``engine.Engine``) as the page's engine (app/page_engine.py): what it offers
the page, read from the engine's public methods and snapshots."""
from __future__ import annotations

from engine import Engine


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

    @property
    def config(self):
        return self.engine.config

    @property
    def semantics(self):
        return self.engine.semantics

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def history(self):
        return self.engine.history

    @property
    def snapshot(self):
        return self.engine.snapshot

    @property
    def step_no(self) -> int:
        return self.engine.step_no

    @property
    def event_counts(self) -> dict[str, int]:
        return self.engine.event_counts

    @property
    def num_finished(self) -> int:
        return self.engine.num_finished

    def tokenize(self, prompt) -> list[int]:
        return self.engine.tokenize(prompt)

    def decode_tokens(self, token_ids) -> list[str]:
        return self.engine.decode_tokens(token_ids)

    def check_request(self, prompt, params):
        return self.engine.check_request(prompt, params)

    def add_request(self, prompt, params) -> str:
        return self.engine.add_request(prompt, params)

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self):
        return self.engine.step()

    def close(self) -> None:
        self.engine.close()
