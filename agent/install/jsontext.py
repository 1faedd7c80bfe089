"""Our entry in a config list's own text: every byte outside it stays as the file's owner wrote it.

The node's primary config belongs to its CNI (and often to a config manager that compares its
bytes). Adding our entry inserts one element, with the separator the list already uses, after
the last plugin; removing it cuts exactly that separator and element. So uninstall gives back
the owner's bytes, whatever their indentation, key order or line endings. `None` means the
text cannot be edited in place (no top-level `plugins` array): the caller writes the whole file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class ListText:
    """Where the elements of the top-level `plugins` array are in a config's text."""

    text: str
    open_end: int
    """Index right after `[`."""
    close: int
    """Index of `]`."""
    spans: tuple[tuple[int, int], ...]
    """(start, end) of each element."""


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _value_end(text: str, i: int) -> int:
    _, end = _DECODER.raw_decode(text, i)
    return int(end)


def _array(text: str, i: int) -> ListText:
    """The array starting at text[i] == '['."""
    spans: list[tuple[int, int]] = []
    j = _skip(text, i + 1)
    if text[j : j + 1] == "]":
        return ListText(text, i + 1, j, ())
    while True:
        end = _value_end(text, j)
        spans.append((j, end))
        j = _skip(text, end)
        if text[j : j + 1] == ",":
            j = _skip(text, j + 1)
            continue
        if text[j : j + 1] == "]":
            return ListText(text, i + 1, j, tuple(spans))
        raise ValueError(f"expected ',' or ']' at {j}")


def locate(text: str) -> ListText | None:
    """The `plugins` array of a JSON object (the last one, as a JSON parser keeps it)."""
    try:
        i = _skip(text, 0)
        if text[i : i + 1] != "{":
            return None
        i = _skip(text, i + 1)
        found = None
        while text[i : i + 1] != "}":
            key, i = _DECODER.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or text[i : i + 1] != ":":
                return None
            i = _skip(text, i + 1)
            if key == "plugins" and text[i : i + 1] == "[":
                found = _array(text, i)
                i = found.close + 1
            else:
                i = _value_end(text, i)
            i = _skip(text, i)
            if text[i : i + 1] == ",":
                i = _skip(text, i + 1)
            elif text[i : i + 1] != "}":
                return None
        return found if _skip(text, i + 1) == len(text) else None
    except ValueError:
        return None


def _render(entry: Mapping[str, Any], layout: ListText, separator: str) -> str:
    """The entry indented like the element it follows (one line if that one is)."""
    newline = "\r\n" if "\r\n" in separator else "\n"
    if "\n" not in separator:
        compact = '": ' not in layout.text
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":") if compact else None)
    prefix = separator.rsplit("\n", 1)[1]
    unit = "  "
    if layout.spans:
        start, end = layout.spans[-1]
        lines = layout.text[start:end].splitlines()
        if len(lines) > 1 and lines[1].startswith(prefix):
            inner = lines[1][len(prefix) :]
            unit = inner[: len(inner) - len(inner.lstrip(" \t"))] or unit
    return json.dumps(entry, indent=unit, ensure_ascii=False).replace("\n", newline + prefix)


def _separator(layout: ListText) -> str:
    """The text between the last two elements (",\n    "), else "," and the text after `[`."""
    spans = layout.spans
    if len(spans) >= 2:
        return layout.text[spans[-2][1] : spans[-1][0]]
    return "," + (layout.text[layout.open_end : spans[0][0]] if spans else "")


def rewrite(
    text: str, is_ours: Callable[[Any], bool], entry: Mapping[str, Any] | None
) -> str | None:
    """`text` without the elements `is_ours` picks, then `entry` appended last (None: none).

    Each element that stays keeps the separator before it (the first that stays, the text after
    `[`), so cutting the last element and appending it again with the separator that preceded it
    gives back the very same bytes."""
    layout = locate(text)
    if layout is None:
        return None
    spans = layout.spans
    kept = [n for n, (a, b) in enumerate(spans) if not is_ours(json.loads(text[a:b]))]
    lead = text[layout.open_end : spans[0][0]] if spans else ""
    parts = [text[: layout.open_end]]
    for k, n in enumerate(kept):
        parts.append(lead if k == 0 else text[spans[n - 1][1] : spans[n][0]])
        parts.append(text[spans[n][0] : spans[n][1]])
    if entry is not None:
        separator = _separator(layout)
        parts += [separator if kept else lead, _render(entry, layout, separator)]
    parts.append(text[spans[-1][1] if spans else layout.open_end :])
    return "".join(parts)
