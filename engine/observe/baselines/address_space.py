"""A linear KV address space with first-fit placement, so external fragmentation is measured.

Invariant: ``holes`` is sorted by start, holes never touch or overlap (neighbours are merged
on free), and sum(holes) + sum(allocated extents) == size.
"""
from __future__ import annotations

import bisect


class FirstFitSpace:
    def __init__(self, size: int):
        self.size = size
        self.holes: list[list[int]] = [[0, size]] if size else []   # [start, length]
        self.extents: dict[int, int] = {}                            # start -> length

    def allocate(self, length: int) -> int | None:
        """Start of the lowest hole that fits ``length`` slots, or None."""
        for i, (start, size) in enumerate(self.holes):
            if size >= length:
                if size == length:
                    del self.holes[i]
                else:
                    self.holes[i] = [start + length, size - length]
                self.extents[start] = length
                return start
        return None

    def free(self, start: int) -> None:
        length = self.extents.pop(start)
        i = bisect.bisect_left(self.holes, [start, 0])
        self.holes.insert(i, [start, length])
        # merge with the right, then the left neighbour
        if i + 1 < len(self.holes) and start + length == self.holes[i + 1][0]:
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    @property
    def free_total(self) -> int:
        return sum(h[1] for h in self.holes)
