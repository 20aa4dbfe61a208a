"""Traces round-trip through JSON; bad files give a clear ValueError; metrics export as CSV."""
from __future__ import annotations

import gzip
import io
import json

import pandas as pd
import pytest

from app.trace_io import (MAX_DEPTH, load_trace, metrics_csv, nesting_depth, stats_frame,
                          trace_gzip, trace_json)

from .conftest import needs_model


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


# ---- uploads from anybody: bounded, parsed without recursion, checked field by field -------
def _snapshot_dict(run, index: int = 1) -> dict:
    eng, _ = run
    return json.loads(json.dumps(eng.history[index].to_dict()))


@pytest.mark.parametrize("data", [b"[" * 100_000, b'{"a":' * 100_000, b"[" * 11 + b"]" * 11])
def test_deep_nesting_is_a_clear_error_not_a_recursion_error(data):
    with pytest.raises(ValueError, match="nested deeper than 10 levels"):
        load_trace(data)


def test_brackets_inside_strings_do_not_count(parallel_run):
    d = _snapshot_dict(parallel_run)
    d["model"] = "[[[[[[[[[[[[ \\\" {{{{{{{{{{{{"
    assert load_trace(json.dumps([d]))[0].model == d["model"]
    assert nesting_depth(trace_json(parallel_run[0].history)) <= MAX_DEPTH


def test_an_oversized_trace_is_refused_before_it_is_decoded():
    with pytest.raises(ValueError, match=r"the file is 2\.0 MB: this server accepts traces up "
                                         r"to 1 MB \(server\.maxUploadSize\)"):
        load_trace(b"\xff" * (2 << 20), max_bytes=1 << 20)     # not even UTF-8: size comes first


def test_a_trace_with_too_many_snapshots_is_refused(parallel_run, monkeypatch):
    snaps = list(parallel_run[0].history)
    monkeypatch.setenv("PAGED_LAB_MAX_TRACE_SNAPSHOTS", str(len(snaps) - 1))
    limit = len(snaps) - 1
    # read one snapshot at a time: the reader stops at the first past the limit (issue 45)
    with pytest.raises(ValueError, match=rf"has more than {limit} snapshots: this server "
                                         rf"replays at most {limit} "
                                         rf"\(PAGED_LAB_MAX_TRACE_SNAPSHOTS\)"):
        load_trace(trace_json(snaps))
    monkeypatch.setenv("PAGED_LAB_MAX_TRACE_SNAPSHOTS", str(len(snaps)))
    assert load_trace(trace_json(snaps)) == snaps


def _set(d, path, value):
    *parents, last = path
    for key in parents:
        d = d[key]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value


@pytest.mark.parametrize("path, value, words", [
    (["step"], "1", "field 'step' must be an integer, got '1'"),
    (["step"], True, "field 'step' must be an integer, got True"),
    (["kind"], KeyError, "field 'kind' is missing"),
    (["step_time_s"], "fast", "field 'step_time_s' must be a number"),
    (["block_size"], 0, "field 'block_size' must be a positive power of two"),
    (["blocks", 0, "token_ids"], "abc", "field 'blocks[0].token_ids' must be a list"),
    (["blocks", 0, "token_ids"], [1, "x"], "field 'blocks[0].token_ids[1]' must be an integer"),
    (["blocks", 0, "block_hash"], 7, "field 'blocks[0].block_hash' must be a string"),
    (["sequences", 0, "finish_reason"], [], "field 'sequences[0].finish_reason' must be a string"),
    (["stats", "used_blocks"], KeyError, "field 'stats.used_blocks' is missing"),
    (["stats", "surprise"], 1, "unexpected field 'stats.surprise'"),
    (["accounting", 0, "allocator"], None, "field 'accounting[0].allocator' must be a string"),
    (["events", 0, "kind"], "teleport", "'events[0].kind': unknown event kind 'teleport'"),
    (["events", 0, "seq_id"], {"__class__": 1}, "field 'events[0].seq_id' must be an integer"),
    (["events"], {}, "field 'events' must be a list"),
    (["__init__"], "os.system('x')", "unexpected field '__init__'"),
])
def test_the_first_bad_field_is_named(parallel_run, path, value, words):
    d = _snapshot_dict(parallel_run)
    _set(d, path, value)
    with pytest.raises(ValueError, match="^snapshot 0 of the trace is malformed: ") as err:
        load_trace(json.dumps([d]))
    assert words in str(err.value)


def test_a_swap_mapping_and_non_numbers_are_checked(swap_run):
    snaps = list(swap_run[0].history)
    i, d = next((i, s.to_dict()) for i, s in enumerate(snaps)
                if any(e.kind == "swap_out" for e in s.events))
    j = next(k for k, e in enumerate(d["events"]) if e["kind"] == "swap_out")
    assert load_trace(json.dumps([d]))[0] == snaps[i]
    d["events"][j]["mapping"] = {"zero": 1}
    with pytest.raises(ValueError, match=rf"'events\[{j}\]\.mapping' has key 'zero'"):
        load_trace(json.dumps([d]))
    text = json.dumps([snaps[1].to_dict()]).replace('"step_time_s": ', '"step_time_s": NaN, "x": ')
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        load_trace(text)


@pytest.mark.parametrize("path, value, words", [
    (["sequences", 0, "block_table"], [99999], "seq 0, logical block 0: block 99999 does not "
                                               "exist (the gpu pool has 32)"),
    (["blocks", 1, "ref_count"], -5, "block 1 has refcount -5"),
    (["blocks", 3, "block_id"], 7, "gpu block at position 3 has id 7"),
    (["blocks", 1, "ref_count"], 2, "block 1 has refcount 2 but 4 table entries point at it"),
    (["stats", "used_blocks"], 30, "the stats count 32 blocks, 30 used"),
])
def test_an_impossible_trace_is_refused_naming_the_first_violation(parallel_run, path, value,
                                                                   words):
    d = _snapshot_dict(parallel_run, index=2)
    if path[-1] == "ref_count" and value == 2:
        d["blocks"][1]["state"] = "shared"
        d["blocks"][1]["ref_count"] = 2
    else:
        _set(d, path, value)
    with pytest.raises(ValueError, match="^snapshot 0 of the trace .* is impossible: ") as err:
        load_trace(json.dumps([d]))
    assert words in str(err.value)


@needs_model
def test_a_400_step_trace_exports_compressed_and_loads_back(model):
    from engine import Engine, EngineConfig, SamplingParams
    eng = Engine(EngineConfig(model=model, block_size=8, num_gpu_blocks=128, max_history=400))
    for p in ("ROMEO:", "JULIET: Good night"):
        eng.add_request(p, SamplingParams(max_tokens=420, ignore_eos=True))
    while len(eng.history) < 400 or eng.history[0].step == 0:
        eng.step()
    snaps = list(eng.history)
    plain, packed = trace_json(snaps).encode(), trace_gzip(snaps)
    print(f"\n400 snapshots: {len(plain) / 2**20:.1f} MB of JSON, {len(packed) / 2**20:.2f} MB "
          "gzip")
    assert len(packed) < 5 * 2**20 < len(plain)       # over the upload limit only uncompressed
    assert load_trace(packed, max_bytes=5 * 2**20) == snaps


def test_a_gzip_that_inflates_past_the_limit_is_stopped(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_TRACE_MB", "1")
    bomb = gzip.compress(b"[" + b" " * (50 * 2**20) + b"]")
    assert len(bomb) < 2**20
    with pytest.raises(ValueError, match="inflates to more than 1 MB of JSON"):
        load_trace(bomb)
    with pytest.raises(ValueError, match="cut short"):
        load_trace(gzip.compress(b"[1, 2]")[:-12])
