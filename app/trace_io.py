"""Save and load traces (a JSON list of ``StepSnapshot.to_dict()``, gzip-compressed on
export: a 400-step trace is ~34 MB of JSON and ~2 MB compressed, so it uploads back within
server.maxUploadSize) and metrics as CSV.

An uploaded trace is somebody else's file: it is size-checked before it is decoded, read one
snapshot at a time (app/trace_stream.py: no more items decoded than
PAGED_LAB_MAX_TRACE_SNAPSHOTS, nesting and integer sizes bounded while decoding), and
every field is type-checked against the snapshot dataclasses before one is built, then
against what every recorded snapshot satisfies (engine/observe/snapshot_checks.py: no block
99999, no refcount -5). A gzip upload is
decompressed in bounded chunks, never past PAGED_LAB_MAX_TRACE_MB. Nothing in a trace is
executed; errors name the first bad field or violation.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import zlib
import itertools
import json
import math
import re
import types
import typing

import pandas as pd

from engine import StepSnapshot
from engine.observe.accounting import accounting_frame
from engine.events import EVENT_KINDS
from engine.observe.snapshot_checks import first_violation

from app import hosting
from app.trace_steps import first_step_violation
from app.trace_stream import HugeNumber, MAX_INT_DIGITS, TooMany, iter_list

MAX_TRACE_BYTES = 5 * 1024 * 1024    # the page passes server.maxUploadSize instead
MAX_DEPTH = 10                       # a saved trace nests 5 deep (list > snapshot > blocks > ...)
MAX_STRING_CHARS = 1 << 18           # a sequence's text at the longest context is ~40 K chars


GZIP_MAGIC = b"\x1f\x8b"


def trace_json(snapshots) -> str:
    return json.dumps([s.to_dict() for s in snapshots])


def trace_gzip(snapshots) -> bytes:
    """The trace as gzip-compressed JSON (what the Export tab downloads)."""
    return gzip.compress(trace_json(snapshots).encode("utf-8"), compresslevel=6, mtime=0)


def gunzip_bounded(data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed, refused (ValueError) as soon as it would pass ``max_bytes``: a
    small file that inflates without end is stopped, not read."""
    d = zlib.decompressobj(wbits=31)              # gzip framing
    out = bytearray()                    # grown in place: no list of chunks joined at the end
    try:
        chunk = d.decompress(data, 1 << 20)
        while chunk:
            if len(out) + len(chunk) > max_bytes:
                raise ValueError(f"the trace inflates to more than {max_bytes / 2**20:g} MB of "
                                 "JSON: this server reads up to that (PAGED_LAB_MAX_TRACE_MB)")
            out += chunk
            chunk = d.decompress(d.unconsumed_tail, 1 << 20)
    except zlib.error as exc:
        raise ValueError(f"not a trace: a damaged gzip file ({exc})") from None
    if not d.eof:
        raise ValueError("not a trace: the gzip file is cut short")
    return bytes(out)


# ---- parsing safely ------------------------------------------------------------------------
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting_depth(text: str) -> int:
    """How deep JSON arrays and objects nest in ``text`` (brackets inside strings ignored),
    computed without recursion, so a file of 100,000 ``[`` is measured, not parsed."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


# ---- checking every field ------------------------------------------------------------------
class BadField(ValueError):
    """A trace field that does not match the snapshot dataclasses; ``where`` names it."""


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(value, hint, where: str) -> None:
    """``value`` (parsed JSON) matches the dataclass field type ``hint`` or BadField."""
    if isinstance(value, HugeNumber):    # app/trace_stream.py: never converted
        raise BadField(f"field {where!r} is a {value.digits:,}-digit number: a trace's "
                       f"integers have at most {MAX_INT_DIGITS} digits")
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        raise BadField(f"field {where!r} is a string of {len(value):,} characters: a trace's "
                       f"strings have at most {MAX_STRING_CHARS:,}")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _check(value, options[0], where)
        raise BadField(f"field {where!r}: unsupported type {hint}")   # none in the snapshots
    if hint is bool:
        ok, kind = isinstance(value, bool), "true or false"
    elif hint is int:
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif hint is float:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value))
        kind = "a number"
    elif hint is str:
        ok, kind = isinstance(value, str), "a string"
    elif origin is tuple:
        if not isinstance(value, list):
            raise BadField(f"field {where!r} must be a list, got {_show(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            if args[0] in (int, str) and all(type(x) is args[0] for x in value):
                return                           # the common case (token ids), checked fast
            for i, item in enumerate(value):
                _check(item, args[0], f"{where}[{i}]")
            return
        if len(value) != len(args):
            raise BadField(f"field {where!r} must be a list of {len(args)}, got {_show(value)}")
        for i, (item, arg) in enumerate(zip(value, args)):
            _check(item, arg, f"{where}[{i}]")
        return
    elif dataclasses.is_dataclass(hint):
        return _check_object(value, hint, where)
    else:
        raise BadField(f"field {where!r}: unsupported type {hint}")
    if not ok:
        raise BadField(f"field {where!r} must be {kind}, got {_show(value)}")


def _check_mapping(value, where: str) -> None:
    """A swap event's mapping: JSON object {"src block": dst block}."""
    if not isinstance(value, dict):
        raise BadField(f"field {where!r} must be an object of block ids, got {_show(value)}")
    for src, dst in value.items():
        if not src.lstrip("-").isdigit():
            raise BadField(f"field {where!r} has key {_show(src)}: expected a block id")
        _check(dst, int, f"{where}[{src}]")


@functools.lru_cache(maxsize=None)
def _schema(cls) -> tuple[dict, tuple]:
    return typing.get_type_hints(cls), dataclasses.fields(cls)


def _check_object(value, cls, where: str, skip: tuple[str, ...] = ()) -> None:
    """A JSON object with ``cls``'s fields: required ones present, each of its type, no
    others (the names in ``skip`` are checked by the caller)."""
    if not isinstance(value, dict):
        raise BadField(f"field {where!r} must be an object, got {_show(value)}")
    hints, fields = _schema(cls)
    names = set()
    for f in fields:
        names.add(f.name)
        path = f"{where}.{f.name}" if where else f.name
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise BadField(f"field {path!r} is missing")
            continue
        if f.name in skip:
            continue
        if f.name == "mapping":
            _check_mapping(value[f.name], path)
        else:
            _check(value[f.name], hints[f.name], path)
    extra = [k for k in value if k not in names and k != "kind"]
    if extra:
        raise BadField(f"unexpected field {(f'{where}.' if where else '') + str(extra[0])!r}")


def _check_snapshot(d) -> None:
    _check_object(d, StepSnapshot, "", skip=("events",))
    events = d["events"]
    if not isinstance(events, list):
        raise BadField(f"field 'events' must be a list, got {_show(events)}")
    for i, e in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(e, dict):
            raise BadField(f"field {where!r} must be an object, got {_show(e)}")
        cls = EVENT_KINDS.get(e.get("kind"))
        if cls is None:
            raise BadField(f"field {where + '.kind'!r}: unknown event kind {_show(e.get('kind'))}")
        _check_object(e, cls, where)
    bs = d["block_size"]
    if bs < 1 or bs & (bs - 1):
        raise BadField(f"field 'block_size' must be a positive power of two, got {bs}")


def _upload_text(data: bytes | str, max_bytes: int) -> str:
    """The upload as text: size first, then UTF-8."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ValueError(f"the file is {size / 2**20:.1f} MB: this server accepts traces up to "
                         f"{max_bytes / 2**20:g} MB (server.maxUploadSize)")
    if isinstance(data, bytes):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("not a trace: the file is not UTF-8 text (expected JSON)") from None
    return data


def _not_a_list(text: str) -> ValueError:
    """Why a document that is not a list is refused: only a bounded prefix of it is read."""
    head = text[:1 << 16]
    if nesting_depth(head) > MAX_DEPTH:
        return ValueError(f"not a trace: JSON nested deeper than {MAX_DEPTH} levels")
    if len(head) == len(text):           # small: say whether it is JSON at all
        try:
            json.loads(head, parse_int=lambda s: 0, parse_constant=lambda s: 0)
        except json.JSONDecodeError as exc:
            return ValueError(f"not a trace: invalid JSON ({exc.msg}, line {exc.lineno})")
    return ValueError("not a trace: expected a non-empty JSON list of snapshots")


def load_trace(data: bytes | str, *, max_bytes: int = MAX_TRACE_BYTES,
               max_snapshots: int | None = None) -> list[StepSnapshot]:
    """Snapshots from a saved trace; ValueError (with a reason a person can act on) otherwise.
    ``max_snapshots`` defaults to PAGED_LAB_MAX_TRACE_SNAPSHOTS. Read one snapshot at a time
    (app/trace_stream.py): at most the limit's snapshots are ever decoded."""
    if isinstance(data, bytes) and data.startswith(GZIP_MAGIC):
        if len(data) > max_bytes:
            raise ValueError(f"the file is {len(data) / 2**20:.1f} MB: this server accepts "
                             f"traces up to {max_bytes / 2**20:g} MB (server.maxUploadSize)")
        data = gunzip_bounded(data, hosting.max_trace_json_bytes())
        max_bytes = len(data)
    text = _upload_text(data, max_bytes)
    del data                             # the bytes go once the text exists
    limit = hosting.max_trace_snapshots() if max_snapshots is None else max_snapshots
    out = []
    items = iter_list(text, max_items=limit, max_depth=MAX_DEPTH, not_a_list=_not_a_list)
    try:
        for i, d in enumerate(items):
            if not isinstance(d, dict):
                raise ValueError(f"not a trace: item {i} is not a snapshot object")
            try:
                _check_snapshot(d)
                snap = StepSnapshot.from_dict(d)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"snapshot {i} of the trace is malformed: {exc}") from None
            impossible = first_violation(snap)
            if impossible:
                raise ValueError(f"snapshot {i} of the trace (step {snap.step}) is impossible: "
                                 f"{impossible}")
            out.append(snap)
    except TooMany:
        raise ValueError(f"the trace has more than {limit:,} snapshots: this server replays at "
                         f"most {limit:,} (PAGED_LAB_MAX_TRACE_SNAPSHOTS)") from None
    if not out:
        raise ValueError("not a trace: expected a non-empty JSON list of snapshots")
    bad_steps = first_step_violation(out)
    if bad_steps:
        raise ValueError(f"the trace's steps are impossible: {bad_steps}")
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
