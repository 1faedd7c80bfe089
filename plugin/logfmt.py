"""One log line per record, whatever a value holds: the escaping the agent's log lines and the
plugin's share (agent/logs.py, plugin/log.py). Values often come from a pod's owner (its name,
its annotations), so none may end the line, forge a field or carry a terminal escape.
Standard library only, and cheap to import: the plugin imports it on every exec."""

from __future__ import annotations

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_LINE_BREAKS_IN_JSON = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
"""What json.dumps leaves raw (ensure_ascii off) that a reader's splitlines() takes as a line
break; inside a JSON string its escape means the same character."""


def quote(value: str) -> str:
    """A logfmt value: bare when it is printable with no space, quote, `=` or backslash; else
    quoted, with quotes, backslashes and every character that is not printable escaped (control
    characters, terminal escapes, NUL, U+2028/U+2029, bidirectional marks): a value cannot end
    the line or start a field of its own."""
    if value and value.isprintable() and not any(c in value for c in ' "=\\'):
        return value
    return '"' + "".join(_escape(c) for c in value) + '"'


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    return ascii(char)[1:-1]  # \x1b, \x00, \u2028, \U000e0001


def json_line_breaks_escaped(line: str) -> str:
    """A JSON text (from json.dumps with ensure_ascii off) that splitlines() keeps whole."""
    for char, escaped in _LINE_BREAKS_IN_JSON.items():
        if char in line:
            line = line.replace(char, escaped)
    return line
