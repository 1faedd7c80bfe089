"""`json.loads` / `json.dumps` through the C accelerator `_json`, without importing `json`.

Importing `json` pulls in `re`, `enum`, `functools` and `collections`: ~7 ms of every plugin
exec, paid by every pod start. The C scanner and encoder here are the very ones `json` uses
for its defaults, set up the same way, so a document that parses gives the same object and an
object gives the same text. Anything off the common path (a BOM, UTF-16/32 input, invalid JSON,
a value that cannot be encoded) is handed to the real `json`, imported then, so errors and
their messages stay exactly json's.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
# First bytes of a UTF-8 document json would not decode as UTF-8 (BOMs, UTF-16/32) start with
# one of these or hold a NUL in the first two bytes; every JSON text in ASCII starts otherwise.
_PLAIN_FIRST = frozenset(b'{["-0123456789tfn \t\n\r')


class _DecoderContext:
    """The attributes the C scanner reads from json.JSONDecoder() with default arguments."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


# typeshed wants a JSONDecoder; the C scanner reads only the attributes above.
_scan = _json.make_scanner(_DecoderContext())  # type: ignore[arg-type]


def loads(data: str | bytes) -> Any:
    """json.loads(data)."""
    text: str | None = None
    if isinstance(data, str):
        if not data.startswith("\ufeff"):
            text = data
    elif (
        isinstance(data, (bytes, bytearray))
        and data[:1]
        and data[0] in _PLAIN_FIRST
        and (len(data) < 2 or data[1] != 0)
    ):
        try:
            text = bytes(data).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            text = None
    if text is not None:
        start = _skip(text, 0)
        try:
            obj, end = _scan(text, start)
        except (StopIteration, ValueError, SystemError):
            # json raises the right error below. (The C scanner builds its error from
            # json.decoder only when that is already imported; else it fails with SystemError.)
            pass
        else:
            if _skip(text, end) == len(text):
                return obj
    import json  # the uncommon path: json's own handling and error messages

    return json.loads(data)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at


def _default(obj: object) -> object:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def dumps(obj: object) -> str:
    """json.dumps(obj)."""
    return _encode(obj, ascii=True, separators=(", ", ": "), options={})


def dumps_compact(obj: object) -> str:
    """json.dumps(obj, separators=(",", ":"), ensure_ascii=False)."""
    return _encode(
        obj,
        ascii=False,
        separators=(",", ":"),
        options={"separators": (",", ":"), "ensure_ascii": False},
    )


def _encode(
    obj: object, *, ascii: bool, separators: tuple[str, str], options: dict[str, Any]
) -> str:
    # A new encoder per call, as json makes one: its circular-reference markers are per call.
    # Arguments: markers, default, string encoder, indent, key separator, item separator,
    # sort_keys, skipkeys, allow_nan (what json.JSONEncoder.iterencode passes).
    string = _json.encode_basestring_ascii if ascii else _json.encode_basestring
    encoder = _json.make_encoder(
        {}, _default, string, None, separators[1], separators[0], False, False, True
    )
    try:
        return "".join(encoder(obj, 0))
    except (TypeError, ValueError, RecursionError):
        import json  # json raises the same error, with its own message

        return json.dumps(obj, **options)
