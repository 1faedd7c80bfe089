"""Bounded, escaped text for what others read: CNI replies, Events, API error bodies.

A pod's value or a tool's output can hold line breaks, terminal escapes, NUL bytes or whole
files. `excerpt` shows a foreign value as a short Python-style literal (quotes, escapes, `...`
when cut), so an error names what was refused without carrying it; `bounded` makes a message
one printable line of limited length. The full text goes only to the node's log.
"""

from __future__ import annotations

EXCERPT_CHARS = 60
"""How much of a refused value an error shows."""
SUMMARY_CHARS = 200
"""How much of a tool's error output a reply shows (the log has all of it)."""


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` as an escaped literal of at most about `limit` characters: `'eth0\\n-j ACC'...`."""
    text = value if isinstance(value, str) else repr(value)
    cut = len(text) > limit
    shown = ascii(text[:limit])
    return f"{shown}... ({len(text)} characters)" if cut else shown


def bounded(text: str, limit: int = 1024, *, escape_backslash: bool = False) -> str:
    """`text` as one printable ASCII line: control characters and non-ASCII escaped, cut to
    `limit`. Backslashes are kept (an excerpt's escapes stay readable) unless
    `escape_backslash`, which makes the escaping reversible."""
    out: list[str] = []
    size = 0
    for ch in text:
        piece = ch if " " <= ch <= "~" and ch != "\\" else ascii(ch)[1:-1]
        if ch == "\\":
            piece = "\\\\" if escape_backslash else ch
        if size + len(piece) > limit:
            out.append("...")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def tool_summary(stderr: str, limit: int = SUMMARY_CHARS) -> str:
    """A tool's error output as a reply may show it: its first non-empty line, escaped and cut,
    and how many lines there were in all."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "no error output"
    first = bounded(lines[0].strip(), limit)
    more = f" (+{len(lines) - 1} more lines in the agent's log)" if len(lines) > 1 else ""
    return first + more
