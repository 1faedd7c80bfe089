"""Reading a list answer one item at a time as it arrives, and what a new list changed.

`json.loads` of a list builds every item whole before the cache slims the first: a node's list
of fat pods (1.4 MB of container args each costs some 16 MB as Python objects) would cost the
sum of them all at once, and the answer's text the sum of their JSON. `read` decodes the
top-level object key by key as the answer streams in and hands each item of `items` to `each`
as soon as it is decoded: what is alive at once is the text of one item (and of the chunk that
ends it) and that item parsed; with a reading (agent.pods.skim), of each item only what is read.
The answer must be one JSON object, as `json.loads` accepts it.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from agent.pods import skim

T = TypeVar("T")
Obj = dict[str, Any]

CHUNK_BYTES = 1 << 16
"""Bytes asked of the answer at a time."""

_SPACE = re.compile(r"[ \t\n\r]*")


def chunks(answer: Any) -> Iterable[bytes]:
    """The body of a raw answer as it arrives (a test double may hold it whole in `.data`)."""
    stream = getattr(answer, "stream", None)
    return stream(CHUNK_BYTES, decode_content=True) if callable(stream) else [answer.data]


class _Text:
    """The answer's text not consumed yet, read on as a value needs it."""

    def __init__(self, data: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(data)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._ended = False
        self.text = ""
        self.at = 0

    def more(self) -> bool:
        """Read at least as much again as is held (so a long value is decoded a few times at
        most, not once per chunk); False at the end of the answer."""
        if self._ended:
            return False
        pieces, size = [self.text[self.at :]], 0
        wanted = max(len(pieces[0]), 1)
        for chunk in self._chunks:
            pieces.append(self._utf8.decode(chunk))
            size += len(pieces[-1])
            if size >= wanted:
                break
        else:
            pieces.append(self._utf8.decode(b"", final=True))
            self._ended = True
        self.text, self.at = "".join(pieces), 0
        return True

    def char(self) -> str:
        """The next character that is not white space ("" at the end); not consumed."""
        while True:
            space = _SPACE.match(self.text, self.at)  # matches even no white space
            self.at = space.end() if space else self.at
            if self.at < len(self.text) or not self.more():
                return self.text[self.at] if self.at < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.char() != char:
            raise ValueError(f"{char!r} expected in the answer")
        self.at += 1

    def value(self, reading: skim.Reading = skim.KEEP) -> Any:
        """The next JSON value, consumed: what `reading` reads of it (agent.pods.skim)."""
        self.char()
        while True:
            try:
                value, end = skim.read(self.text, reading, self.at, whole_below=skim.WHOLE_BELOW)
            except json.JSONDecodeError:
                if self.more():
                    continue  # cut by the chunk: decode it again with more text
                raise
            if end == len(self.text) and self.more():
                continue  # a number may go on in the next chunk
            self.at = end
            return value


def read(
    data: Iterable[bytes] | bytes | str,
    each: Callable[[Any], T],
    reading: skim.Reading = skim.KEEP,
) -> tuple[list[T], Obj]:
    """`each` of every item of the object's `items`, and the object's other keys. `data`: the
    answer's chunks, or its whole text; `reading`: what is built of each item (the rest of it
    is skipped in the text: agent.pods.skim).

    Raises ValueError when the answer is not one JSON object."""
    if isinstance(data, str | bytes):
        data = [data.encode() if isinstance(data, str) else data]
    text = _Text(data)
    items: list[T] = []
    rest: Obj = {}
    text.expect("{")
    ended = text.char() == "}"
    while not ended:
        key = text.value()
        if not isinstance(key, str):
            raise ValueError("object key expected in the answer")
        text.expect(":")
        if key == "items":
            items.clear()  # a repeated key: the last one counts, as with json.loads
            rest.pop(key, None)
        if key == "items" and text.char() == "[":
            text.at += 1
            _items(text, each, items, reading)
        else:
            rest[key] = text.value()
        ended = text.char() != ","
        text.at += 0 if ended else 1
    text.expect("}")
    if text.char() != "":
        raise ValueError("extra data after the answer's object")
    return items, rest


def _items(text: _Text, each: Callable[[Any], T], items: list[T], reading: skim.Reading) -> None:
    """The array's items, each handed to `each` before the next is decoded (after its "[")."""
    if text.char() == "]":
        text.at += 1
        return
    while True:
        item = text.value(reading)
        items.append(each(item))
        del item  # the item's full form goes before the next one is decoded
        if text.char() == "]":
            text.at += 1
            return
        text.expect(",")


def differences(
    old: dict[tuple[str, str], Obj], new: dict[tuple[str, str], Obj]
) -> list[tuple[str, Obj | None, Obj | None]]:
    """The add/update/delete events that turn `old` into `new` (by resourceVersion)."""
    changes: list[tuple[str, Obj | None, Obj | None]] = []
    for key, obj in new.items():
        before = old.get(key)
        if before is None:
            changes.append(("add", None, obj))
        elif _version(before) != _version(obj):
            changes.append(("update", before, obj))
    changes += [("delete", obj, None) for key, obj in old.items() if key not in new]
    return changes


def _version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))
