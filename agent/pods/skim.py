"""Reading of a JSON object that builds only the values a reading names: the rest is skipped.

`json.loads` of a fat pod builds all of it before agent.pods.slim keeps a few fields: a pod of
1.4 MB (its labels, annotations, managedFields, container args) is some 16 MB of Python objects
for an instant, and the allocator keeps what that instant took: 20 such pods on a node left the
agent at 46 MiB of RSS against 29.5 MiB with none. `read` walks the text instead, and builds a
value only where its reading (`Reading`) names it; everything else is skipped by a regular
expression that finds its end (strings and brackets counted, nothing built). What it returns is
the object with only those fields, which slim then reads as it reads a whole one.

A reading is
- `KEEP`: the value, built whole (json's own decoder: a scalar the agent reads);
- a dict: of an object, those keys, each read by its own reading (others skipped);
- `Items(reading, where=..., unique=..., last=..., first=...)`: of an array, each item read by
  `reading`, kept when `where` says so, the last (or first) one kept of those `unique` maps to
  the same key, at most `first` of them (the rest skipped, not built). One item is built at a
  time;
- a dict reading of an array reads each of its items so.
A value of another kind than its reading expects (an array where an object is read) is built
whole, as json.loads would build it, so that slim sees what it would have seen.

Skipped values are only scanned for their end: the API server's JSON is well-formed, and a
value never read cannot change a decision. What is read is decoded by json's decoder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

KEEP = True

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_SCALAR = re.compile(r"[^,\]}\s]+")
_NOT_BRACKET = re.compile(r'(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+', re.DOTALL)
"""A run of text with no bracket outside a string (strings skipped whole)."""
_FLAT = re.compile(r'\{(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+\}', re.DOTALL)
"""An object with no object or array inside."""
_CLOSER = {"{": "}", "[": "]"}
SMALL_ITEM = 2048
"""An array's item shorter than this is decoded whole, then pruned to its reading."""
WHOLE_BELOW = 64 << 10
"""An object's text shorter than this is decoded whole by `loads` (json's C decoder): a pod of
a few KiB builds little, and skimming it in Python would take some ten times as long."""


@dataclass(frozen=True)
class Items:
    """The reading of an array: see the module's docstring."""

    reading: Reading
    where: Callable[[Any], bool] | None = None
    unique: Callable[[Any], Hashable] | None = None
    last: bool = True
    """Of the items `unique` maps to one key, the last is kept (else the first)."""
    first: int | None = None


Reading = bool | Mapping[str, "Reading"] | Items


def read(text: str, reading: Reading, at: int = 0, *, whole_below: int = 0) -> tuple[Any, int]:
    """The value at `at` (white space before it skipped) as `reading` reads it, and where it
    ends; built whole, by json's decoder, when its text is shorter than `whole_below` (a
    plain pod: what is built is small, and json's C decoder ten times as quick). Raises
    ValueError (json.JSONDecodeError) when the text is not JSON where it is read."""
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches even no space
    opening = text[at : at + 1]
    if whole_below and opening in _CLOSER and skip(text, at) - at < whole_below:
        return _DECODER.raw_decode(text, at)
    if isinstance(reading, Mapping) and opening == "{":
        return _object(text, at + 1, reading)
    if isinstance(reading, Mapping) and opening == "[":
        return _array(text, at + 1, Items(reading))
    if isinstance(reading, Items) and opening == "[":
        return _array(text, at + 1, reading)
    return _DECODER.raw_decode(text, at)


def loads(text: str | bytes, reading: Reading, *, whole_below: int = WHOLE_BELOW) -> Any:
    """The whole text's one JSON value, as `reading` reads it (see `read`)."""
    if isinstance(text, bytes):
        text = text.decode()
    if len(text) < whole_below:
        return json.loads(text)
    value, end = read(text, reading, whole_below=whole_below)
    if _SPACE.match(text, end).end() != len(text):  # type: ignore[union-attr]
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def skip(text: str, at: int) -> int:
    """Where the value at `at` (no white space before it) ends, nothing of it built."""
    opening = text[at : at + 1]
    if opening == '"':
        found = _STRING.match(text, at)
    elif opening in ("{", "["):
        return _skip_nested(text, at)
    else:
        found = _SCALAR.match(text, at)
    if found is None:
        raise json.JSONDecodeError("Expecting value", text, at)
    return found.end()


def _item(text: str, at: int, reading: Reading) -> tuple[Any, int]:
    """One item of an array: a small one decoded by json's C decoder, then pruned to `reading`
    (an array of thousands of small items is read some ten times as quick so)."""
    if reading is KEEP:
        return _DECODER.raw_decode(text, at)
    flat = _FLAT.match(text, at)  # most items: an object of scalars, found in one match
    end = flat.end() if flat is not None else skip(text, at)
    if end - at >= SMALL_ITEM:
        return read(text, reading, at)
    return _prune(_DECODER.raw_decode(text, at)[0], reading), end


def _prune(value: Any, reading: Reading) -> Any:
    """What `read` would have built of `value` (built whole) with `reading`."""
    if isinstance(reading, Mapping) and isinstance(value, dict):
        return {key: _prune(sub, reading[key]) for key, sub in value.items() if key in reading}
    if isinstance(reading, Mapping) and isinstance(value, list):
        return [_prune(item, reading) for item in value]
    if isinstance(reading, Items) and isinstance(value, list):
        kept: list[Any] = []
        by_key: dict[Hashable, Any] = {}
        for item in value:
            if reading.first is not None and len(by_key or kept) >= reading.first:
                break
            _keep(_prune(item, reading.reading), reading, kept, by_key)
        return _done(kept, by_key, reading)
    return value


def _keep(item: Any, reading: Items, kept: list[Any], by_key: dict[Hashable, Any]) -> None:
    if reading.where is not None and not reading.where(item):
        return
    if reading.unique is None:
        kept.append(item)
        return
    key = reading.unique(item)  # in the order each key first came, the last (or first) of each
    if reading.last or key not in by_key:
        by_key[key] = item


def _done(kept: list[Any], by_key: dict[Hashable, Any], reading: Items) -> list[Any]:
    return list(by_key.values()) if reading.unique else kept


def _skip_nested(text: str, at: int, closing: list[str] | None = None) -> int:
    """Past the value opening at `at`, or (with `closing`) past the brackets still open."""
    closing = [] if closing is None else closing  # what each open bracket is closed by
    while True:
        at = _NOT_BRACKET.match(text, at).end()  # type: ignore[union-attr]  # even empty
        bracket = text[at : at + 1]
        if bracket in _CLOSER:
            closing.append(_CLOSER[bracket])
        elif bracket and closing and bracket == closing[-1]:
            closing.pop()
            if not closing:
                return at + 1
        else:  # the end of the text, a string left open, or the wrong bracket
            raise json.JSONDecodeError("Unterminated value", text, at)
        at += 1


def _next(text: str, at: int) -> tuple[str, int]:
    """The next character that is not white space, and where it is."""
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    return text[at : at + 1], at


def _object(text: str, at: int, reading: Mapping[str, Reading]) -> tuple[dict[str, Any], int]:
    """After its "{": the object's keys that `reading` names."""
    kept: dict[str, Any] = {}
    char, at = _next(text, at)
    if char == "}":
        return kept, at + 1
    while True:
        if char != '"':
            raise json.JSONDecodeError("Expecting property name", text, at)
        key, at = _DECODER.raw_decode(text, at)
        char, at = _next(text, at)
        if char != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
        sub = reading.get(key)
        if sub is None:
            at = skip(text, _next(text, at + 1)[1])
        else:
            kept[key], at = read(text, sub, at + 1)  # a repeated key: the last, as json.loads
        char, at = _next(text, at)
        if char == "}":
            return kept, at + 1
        if char != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
        char, at = _next(text, at + 1)


def _array(text: str, at: int, reading: Items) -> tuple[list[Any], int]:
    """After its "[": the items `reading` keeps."""
    kept: list[Any] = []
    by_key: dict[Hashable, Any] = {}
    char, at = _next(text, at)
    if char == "]":
        return kept, at + 1
    while True:
        if reading.first is not None and len(by_key or kept) >= reading.first:
            return _done(kept, by_key, reading), _skip_nested(text, at, ["]"])
        else:
            item, at = _item(text, at, reading.reading)
            _keep(item, reading, kept, by_key)
        char, at = _next(text, at)
        if char == "]":
            return _done(kept, by_key, reading), at + 1
        if char != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
        at = _next(text, at + 1)[1]
