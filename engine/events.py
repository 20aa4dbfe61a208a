"""Every change to KV memory is an Event, emitted in order by the engine.

Events are small frozen dataclasses with a ``kind`` and a JSON-friendly ``to_dict()``. They are
the contract the UI (narration, timeline, CoW arrows) draws from: nothing there is inferred.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"

    def to_dict(self) -> dict:
        d = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "mapping":          # JSON object keys must be strings
                value = {str(src): dst for src, dst in value}
            elif isinstance(value, tuple):
                value = list(value)
            d[f.name] = value
        return d


@dataclass(frozen=True)
class Alloc(Event):
    """A fresh physical block was attached to a sequence's block table."""
    kind: ClassVar[str] = "alloc"
    seq_id: int
    logical: int
    physical: int


@dataclass(frozen=True)
class Free(Event):
    """A block's refcount reached 0; ``cached`` blocks keep their content for prefix reuse."""
    kind: ClassVar[str] = "free"
    physical: int
    cached: bool = False
    device: str = "gpu"


@dataclass(frozen=True)
class Evict(Event):
    """A cached free block was reallocated, so its prefix-cache entry is dropped."""
    kind: ClassVar[str] = "evict"
    physical: int
    block_hash: str


@dataclass(frozen=True)
class Fork(Event):
    """The child got a copy of the parent's block table; each block's refcount went up by 1."""
    kind: ClassVar[str] = "fork"
    parent_seq_id: int
    child_seq_id: int
    physicals: tuple[int, ...]


@dataclass(frozen=True)
class Cow(Event):
    """Copy-on-write: the shared block ``src`` was copied (real K/V bytes) into ``dst``."""
    kind: ClassVar[str] = "cow"
    seq_id: int
    logical: int
    src: int
    dst: int


@dataclass(frozen=True)
class Prefill(Event):
    """Tokens [start, end) of the sequence get their K/V computed and stored this step."""
    kind: ClassVar[str] = "prefill"
    seq_id: int
    start: int
    end: int
    total: int | None = None       # v1 chunked prefill: the prompt's length (chunk of total)


@dataclass(frozen=True)
class Append(Event):
    """The token's K/V is written into flat slot ``slot`` of block ``physical`` this step."""
    kind: ClassVar[str] = "append"
    seq_id: int
    token_id: int
    logical: int
    physical: int
    slot: int


@dataclass(frozen=True)
class PrefixHit(Event):
    """A full block of the prompt was found in the prefix cache and reused, not recomputed."""
    kind: ClassVar[str] = "prefix_hit"
    seq_id: int
    logical: int
    physical: int
    block_hash: str


@dataclass(frozen=True)
class Cached(Event):
    """A full block entered the prefix cache under ``block_hash`` (chained from ``parent_hash``,
    "" for a first block). What vLLM publishes as a ``BlockStored`` KV event."""
    kind: ClassVar[str] = "cached"
    seq_id: int
    physical: int
    block_hash: str
    parent_hash: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class CacheReset(Event):
    """Every prefix-cache entry was dropped (``Engine.reset_prefix_cache``; vLLM's
    ``AllBlocksCleared``)."""
    kind: ClassVar[str] = "cache_reset"


@dataclass(frozen=True)
class Preempt(Event):
    kind: ClassVar[str] = "preempt"
    seq_id: int
    mode: str                      # "recompute" or "swap"
    rule: str = ""                 # why this victim (v1 states its rule)


@dataclass(frozen=True)
class SwapOut(Event):
    """Device blocks copied to CPU swap space: mapping is ((device_block, cpu_block), ...)."""
    kind: ClassVar[str] = "swap_out"
    seq_id: int
    mapping: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SwapIn(Event):
    """CPU blocks copied back to the device: mapping is ((cpu_block, device_block), ...)."""
    kind: ClassVar[str] = "swap_in"
    seq_id: int
    mapping: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Sample(Event):
    """The sampler chose ``token_id`` for the sequence (its K/V is written next step)."""
    kind: ClassVar[str] = "sample"
    seq_id: int
    token_id: int
    logprob: float


@dataclass(frozen=True)
class BeamPrune(Event):
    kind: ClassVar[str] = "beam_prune"
    seq_id: int
    reason: str


@dataclass(frozen=True)
class Finish(Event):
    kind: ClassVar[str] = "finish"
    seq_id: int
    reason: str


EVENT_KINDS = {cls.kind: cls for cls in (Alloc, Free, Evict, Fork, Cow, Prefill, Append, PrefixHit,
                                         Cached, CacheReset, Preempt, SwapOut, SwapIn, Sample, BeamPrune, Finish)}


def event_from_dict(d: dict) -> Event:
    """Inverse of ``Event.to_dict`` (for loading saved traces)."""
    cls = EVENT_KINDS.get(d.get("kind"))
    if cls is None:
        raise ValueError(f"unknown event kind {d.get('kind')!r}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        value = d[f.name]
        if f.name == "mapping":
            value = tuple((int(src), dst) for src, dst in value.items())
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)
