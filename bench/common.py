"""Small helpers shared by the benchmark scripts."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_results(name: str, payload: dict, frame=None) -> None:
    """bench/results/<name>.json (and .csv when a DataFrame is given)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=float))
    if frame is not None:
        frame.to_csv(RESULTS / f"{name}.csv")
    print(f"wrote bench/results/{name}.json" + (" and .csv" if frame is not None else ""))


class Progress:
    """A one-line progress indicator on stderr (long simulations)."""

    def __init__(self, label: str):
        self.label = label
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        if pct != self.last:
            self.last = pct
            print(f"\r{self.label}: {done}/{total} requests finished ({pct}%)", end="",
                  file=sys.stderr, flush=True)
            if done >= total:
                print(file=sys.stderr)
