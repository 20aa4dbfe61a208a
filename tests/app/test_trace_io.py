"""Traces round-trip through JSON; bad files give a clear ValueError; metrics export as CSV."""
from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from app.trace_io import load_trace, metrics_csv, stats_frame, trace_json


def test_trace_round_trip(beam_run):
    eng, _ = beam_run
    snaps = list(eng.history)
    text = trace_json(snaps)
    assert isinstance(json.loads(text), list)
    loaded = load_trace(text.encode())
    assert loaded == snaps
    assert [e.to_dict() for e in loaded[3].events] == [e.to_dict() for e in snaps[3].events]


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe", "not UTF-8"),
    (b"{nope", "invalid JSON"),
    (b"{}", "non-empty JSON list"),
    (b"[]", "non-empty JSON list"),
    (b"[1]", "item 0 is not a snapshot"),
    (b'[{"step": 1}]', "snapshot 0 of the trace is malformed"),
])
def test_bad_traces(data, words):
    with pytest.raises(ValueError, match=words):
        load_trace(data)


def test_bad_event_kind(parallel_run):
    eng, _ = parallel_run
    d = eng.history[1].to_dict()
    d["events"][0]["kind"] = "teleport"
    with pytest.raises(ValueError, match="unknown event kind"):
        load_trace(json.dumps([d]))


def test_metrics_csv(swap_run):
    eng, _ = swap_run
    snaps = list(eng.history)
    frame = pd.read_csv(io.StringIO(metrics_csv(snaps)))
    steps = len(snaps) - 1                            # the init snapshot has no accounting row
    assert len(frame) == 4 * steps
    assert set(frame["allocator"]) == {"paged", "max", "pow2", "oracle"}
    for col in ("token_states", "internal_fragmentation", "token_state_share", "used_blocks",
                "shared_blocks", "step_time_s", "events_preempt"):
        assert col in frame.columns
    stats = stats_frame(snaps)
    assert list(stats["used_blocks"]) == [s.stats.used_blocks for s in snaps]
    assert stats["events_swap_out"].sum() == sum(e.kind == "swap_out" for s in snaps for e in s.events)
