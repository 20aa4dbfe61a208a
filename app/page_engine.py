"""What the page needs from an engine it steps: ``PageEngine``. The lab (app/lab.py) and the
views use only this, never an engine's own class, so our engine (app/our_engine.py) and the
real vLLM (real_vllm/page_engine.py) are told apart by what they say they offer, not by probing
for attributes."""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class LockstepPartner(Protocol):
    """Our engine run beside the page's engine on the same calls, compared after each step
    (real_vllm/lockstep.py's ``Lockstep``)."""
    steps: list                            # each step's views and their first difference

    @property
    def ours_history(self) -> Sequence: ...   # our engine's snapshots

    def summary(self) -> str: ...             # the agreement so far, in words


@runtime_checkable
class PageEngine(Protocol):
    """Requests in, one step at a time, and every step's ``StepSnapshot``."""
    # capabilities: what differs between engines, asked, never probed for
    is_real_vllm: bool                     # the installed vLLM itself, not this lab's engine
    lockstep: LockstepPartner | None       # our engine stepped beside it, or None
    startup_s: float | None                # seconds it took to start (None: nothing to start)
    cache_view: object | None              # its prefix cache rebuilt from its KV events

    @property
    def version(self) -> str: ...          # what runs, as the page names it
    @property
    def config(self): ...                  # the EngineConfig it runs (ours, beside real vLLM)
    @property
    def semantics(self): ...               # the registry's rules it follows
    @property
    def tokenizer(self): ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def history(self) -> Sequence: ...     # StepSnapshots, bounded
    @property
    def snapshot(self): ...                # the newest StepSnapshot
    @property
    def step_no(self) -> int: ...
    @property
    def event_counts(self) -> dict[str, int]: ...
    @property
    def num_finished(self) -> int: ...

    def tokenize(self, prompt) -> list[int]: ...
    def decode_tokens(self, token_ids) -> list[str]: ...
    def check_request(self, prompt, params): ...    # ValueError if it could never run it
    def add_request(self, prompt, params) -> str: ...
    def has_unfinished_requests(self) -> bool: ...
    def step(self): ...
    def close(self) -> None: ...           # gives back what it holds (idempotent)
