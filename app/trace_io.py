"""Save and load traces (a JSON list of ``StepSnapshot.to_dict()``) and metrics as CSV."""
from __future__ import annotations

import json

import pandas as pd

from engine import StepSnapshot
from engine.accounting import accounting_frame

MAX_TRACE_BYTES = 50 * 1024 * 1024


def trace_json(snapshots) -> str:
    return json.dumps([s.to_dict() for s in snapshots])


def load_trace(data: bytes | str) -> list[StepSnapshot]:
    """Snapshots from a saved trace; ValueError (with a reason a person can act on) otherwise."""
    if isinstance(data, bytes):
        if len(data) > MAX_TRACE_BYTES:
            raise ValueError(f"the file is larger than {MAX_TRACE_BYTES >> 20} MiB")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("not a trace: the file is not UTF-8 text (expected JSON)") from None
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a trace: invalid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(raw, list) or not raw:
        raise ValueError("not a trace: expected a non-empty JSON list of snapshots")
    out = []
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise ValueError(f"not a trace: item {i} is not a snapshot object")
        try:
            out.append(StepSnapshot.from_dict(d))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"snapshot {i} of the trace is malformed: {exc}") from None
    return out


def stats_frame(snapshots) -> pd.DataFrame:
    """One row per step: pool stats, step time and how many events of each kind."""
    rows = []
    for s in snapshots:
        row = {"step": s.step, "kind": s.kind, "step_time_s": s.step_time_s,
               "backend": s.backend, **s.stats.__dict__,
               "blocks_saved_by_sharing": s.stats.blocks_saved_by_sharing}
        for e in s.events:
            row[f"events_{e.kind}"] = row.get(f"events_{e.kind}", 0) + 1
        rows.append(row)
    frame = pd.DataFrame(rows)
    ev_cols = [c for c in frame.columns if c.startswith("events_")]
    frame[ev_cols] = frame[ev_cols].fillna(0).astype(int)
    return frame


def metrics_csv(snapshots) -> str:
    """Per-step pool stats joined with the per-allocator accounting (one row per step x allocator)."""
    snapshots = list(snapshots)
    stats = stats_frame(snapshots)
    acc = accounting_frame([(s.step, s.accounting) for s in snapshots if s.kind != "init"])
    if acc.empty:
        return stats.to_csv(index=False)
    merged = acc.merge(stats, on="step", how="left", suffixes=("", "_pool"))
    return merged.to_csv(index=False)
