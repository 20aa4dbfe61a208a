"""``StepView``: what one scheduler iteration leaves, as plain data either engine fills in.

Request ids are the caller's (vLLM's random suffix removed; an n > 1 request's children are
``"{i}_{id}"`` in both engines). Block ids are physical ids in the device pool; block 0 is v1's
null block in both. KV event batches are msgpack payloads encoded with ts = 0 (the only field
that differs between two runs of the same work).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Completion:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""
    logprobs: list[float] = field(default_factory=list)   # with RealVllmEngine(logprobs=True)


@dataclass
class StepView:
    step: int
    scheduled: dict[str, int]             # request -> tokens computed in this step
    preempted: list[str]                  # in the order they were preempted
    running: list[str]                    # the scheduler's running queue, in order
    waiting: list[str]                    # its waiting queue, in order
    num_computed: dict[str, int]          # every unfinished request
    block_tables: dict[str, list[int]]    # every unfinished request holding blocks
    ref_counts: list[int]                 # per physical block
    block_hashes: dict[int, str]          # physical block -> hex hash, for cached blocks
    free_queue: list[int]                 # free blocks, next to be handed out first
    kv_events: list[bytes]                # the batches published for this step
    new_tokens: dict[str, list[int]]      # request -> tokens sampled in this step
    finished: dict[str, str]              # request -> finish reason, for those ending now

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["kv_events"] = [b.hex() for b in self.kv_events]
        d["block_hashes"] = {str(k): v for k, v in self.block_hashes.items()}
        return d
