"""Which recorded step the page shows, and Play's clock: a cursor over a list of snapshots
(the engine's history or a replayed trace) that knows nothing of engines."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Playback:
    view: int | None = None          # index into the snapshots; None = the latest
    playing: bool = False
    last_tick: float = 0.0

    def index(self, n: int) -> int:
        """The shown index among ``n`` snapshots."""
        return n - 1 if self.view is None else max(0, min(self.view, n - 1))

    def at_latest(self, n: int) -> bool:
        return self.index(n) >= n - 1

    def show(self, index: int | None, n: int, replaying: bool) -> None:
        """Show ``index`` (None: follow the latest); live, the last one means "follow"."""
        self.view = None if index is None or (index >= n - 1 and not replaying) \
            else max(0, min(index, n - 1))

    def back(self, n: int) -> None:
        self.view = max(0, self.index(n) - 1)

    def stop(self, view: int | None = None) -> None:
        self.view, self.playing = view, False

    def due(self, interval_s: float) -> bool:
        """Play's turn to step: at most one per interval (a rerun can come early)."""
        if not self.playing:
            return False
        now = time.monotonic()
        if now - self.last_tick < 0.8 * interval_s:
            return False
        self.last_tick = now
        return True
