"""A trace's JSON list read one snapshot at a time, with its bounds enforced while it is read
(issue 45): a 58 KB gzip of ``[{},{},…]`` inflating to 60 MB was parsed whole (20 million
dicts, server RSS 588 → 2,248 MB) before its length was checked.

Why ``json.JSONDecoder.raw_decode`` element by element, not ``json.loads`` or msgspec: both of
those build the whole document before anything can be counted; decoding one list item at a
time (the C scanner, from an offset) lets the reader stop at the first item past the limit, so
a trace costs its text plus at most ``max_items`` decoded items. Inside an item, json's own
scanner bounds recursion (RecursionError, reported as nesting); integers are read through
``parse_int``, which keeps a literal longer than ``MAX_INT_DIGITS`` as a ``HugeNumber`` instead
of converting it (Python refuses 4,300+ digits with a message naming no field), so the field
check (app/trace_io.py) names the field. Strings are bounded by the inflate cap and checked per
field after their item is decoded."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterator

MAX_INT_DIGITS = 20                  # 2**64 has 20 digits: every count, id and step fits
_WS = re.compile(r"[ \t\n\r]*")
_NEXT = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")


@dataclass(frozen=True)
class HugeNumber:
    """An integer literal too long to be any field of a snapshot (its digits are not kept)."""
    digits: int


class TooMany(ValueError):
    """The list holds more items than allowed (how many more is not read)."""


def _int(literal: str):
    digits = len(literal) - literal.startswith("-")
    return HugeNumber(digits) if digits > MAX_INT_DIGITS else int(literal)


def _no_constant(name: str):
    raise ValueError(f"not a trace: {name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_int=_int, parse_constant=_no_constant)


def depth(value) -> int:
    """How deep lists and objects nest in a decoded value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _invalid(exc: json.JSONDecodeError) -> ValueError:
    return ValueError(f"not a trace: invalid JSON ({exc.msg}, line {exc.lineno})")


def iter_list(text: str, *, max_items: int, max_depth: int, not_a_list) -> Iterator[object]:
    """The items of the JSON list ``text``, decoded one at a time. ``not_a_list(text)`` makes
    the error for a document that is not a list; TooMany once more than ``max_items``; a
    ValueError for bad JSON or an item nested (with the list) deeper than ``max_depth``."""
    i = _WS.match(text).end()
    if text[i:i + 1] != "[":
        raise not_a_list(text)
    i = _WS.match(text, i + 1).end()
    if text[i:i + 1] == "]":
        i += 1
    else:
        count = 0
        while True:
            if count == max_items:
                raise TooMany(f"more than {max_items:,}")
            try:
                item, i = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError as exc:
                raise _invalid(exc) from None
            except RecursionError:
                raise ValueError(f"not a trace: JSON nested deeper than {max_depth} levels") \
                    from None
            if depth(item) + 1 > max_depth:
                raise ValueError(f"not a trace: JSON nested deeper than {max_depth} levels")
            count += 1
            yield item
            m = _NEXT.match(text, i)
            if m is None:
                raise _invalid(json.JSONDecodeError("Expecting ',' delimiter", text, i))
            i = m.end()
            if m.group(1) == "]":
                break
    if _WS.match(text, i).end() != len(text):
        raise _invalid(json.JSONDecodeError("Extra data", text, i))
