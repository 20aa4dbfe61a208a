"""Orca-style contiguous allocators (the vLLM paper's baselines), stepped like the engine.

Each request reserves one contiguous extent when admitted, sized by the policy:
- max:    max_model_len per sequence (EngineConfig.max_model_len, default the model's context),
- pow2:   the next power of two >= prompt + output,
- oracle: exactly prompt + output.
A request of ``width`` sequences (n samples or beams) reserves ``width`` times that: without
paging nothing is shared. Requests are admitted FCFS; the head of the queue waits until an
extent fits, even when enough total space is free (that space is external fragmentation).
A step is a prefill step when it admits anything, else a decode step (one token each), the
same rhythm as the engine's scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.observe.baselines.address_space import FirstFitSpace

POLICIES = ("max", "pow2", "oracle")


def reservation(policy: str, prompt_len: int, output_len: int, max_model_len: int) -> int:
    need = prompt_len + output_len
    if policy == "max":
        return max_model_len
    if policy == "pow2":
        return 1 << (need - 1).bit_length()
    if policy == "oracle":
        return need
    raise ValueError(f"unknown baseline policy {policy!r}; choose one of {POLICIES}")


@dataclass
class _Request:
    request_id: str
    prompt_len: int
    output_len: int
    width: int
    extent: int = 0           # slots reserved (all sequences)
    start: int | None = None
    generated: int = 0


class ContiguousAllocator:
    def __init__(self, policy: str, capacity_slots: int, max_model_len: int):
        reservation(policy, 1, 1, max_model_len)           # validates the policy name
        self.policy = policy
        self.max_model_len = max_model_len
        self.space = FirstFitSpace(capacity_slots)
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []
        self.finished = 0
        self.rejected = 0     # could never fit the address space at all

    def _extent(self, r: _Request) -> int:
        size = reservation(self.policy, r.prompt_len, r.output_len, self.max_model_len)
        return r.width * min(size, max(self.max_model_len, r.prompt_len + r.output_len))

    def add(self, request_id: str, prompt_len: int, output_len: int, width: int = 1) -> None:
        r = _Request(request_id, prompt_len, output_len, width)
        r.extent = self._extent(r)
        if r.extent > self.space.size:
            self.rejected += 1          # reported: it could never run contiguously
        else:
            self.waiting.append(r)

    def set_output_len(self, request_id: str, output_len: int) -> None:
        """The engine finished the request early (EOS, stop string): a waiting request's
        reservation shrinks (Pow2 and Oracle size it by length), a running one ends there."""
        for r in self.waiting:
            if r.request_id == request_id:
                r.output_len = min(r.output_len, output_len)
                r.extent = self._extent(r)
                return
        for r in self.running:
            if r.request_id == request_id:
                r.output_len = max(min(r.output_len, output_len), r.generated)
                if r.generated >= r.output_len:
                    self._retire(r)
                return

    def abort(self, request_id: str) -> None:
        self.waiting = [r for r in self.waiting if r.request_id != request_id]
        for r in [r for r in self.running if r.request_id == request_id]:
            self.running.remove(r)
            self.space.free(r.start)

    def _retire(self, r: _Request) -> None:
        self.running.remove(r)
        self.space.free(r.start)
        self.finished += 1

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> None:
        admitted = []
        while self.waiting:
            start = self.space.allocate(self.waiting[0].extent)
            if start is None:
                break
            r = self.waiting.pop(0)
            r.start = start
            admitted.append(r)
        if admitted:
            active = admitted
            self.running += admitted
        else:
            active = self.running
        for r in active:
            r.generated += 1
        for r in [r for r in active if r.generated >= r.output_len]:
            self._retire(r)

    def slabs(self) -> list[tuple]:
        """(request id, start, size, token states, reserved, internal fragmentation) of every
        running request's extent, by start: the picture of the address space."""
        out = []
        for r in sorted(self.running, key=lambda r: r.start):
            final = r.width * (r.prompt_len + r.output_len)
            now = r.width * (r.prompt_len + r.generated - 1)
            out.append((r.request_id, r.start, r.extent, now, final - now, r.extent - final))
        return out

    def accounting(self) -> dict:
        """Slots by the paper's Fig. 2 categories. Token states are tokens whose K/V is stored
        (all but the newest sampled token, as in the engine)."""
        token = reserved = internal = 0
        for _, _, _, now, later, never in self.slabs():
            token += now
            reserved += later
            internal += never
        # external fragmentation: free space the head of the queue cannot use although, in
        # total, it would be enough (after a step, no single hole fits the head)
        free_total = self.space.free_total
        head = self.waiting[0].extent if self.waiting else None
        external = free_total if head is not None and free_total >= head else 0
        free = free_total - external
        return {"allocator": self.policy, "token_states": token, "reserved": reserved,
                "internal_fragmentation": internal, "external_fragmentation": external,
                "free": free, "running": sum(r.width for r in self.running),
                "running_requests": len(self.running), "waiting": len(self.waiting),
                "finished": self.finished, "rejected": self.rejected}
