"""Reading a watch response as it streams: the API server sends one JSON event per line over a
chunked response that stays open until the watch ends."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from agent.errors import WatchError
from agent.kube import api
from agent.pods import skim

_BLANK = re.compile(rb"[ \t\r\n]*\Z")
SHORT_WATCH_SECONDS = 1.0
"""A watch that ends sooner than this with no event is an error (backed off), as in client-go's
reflector: an API server or proxy that answers 200 and closes at once must not be re-asked in a
tight loop."""


def events(response: Any) -> Iterator[bytes | memoryview]:
    """Newline-separated JSON events of a chunked watch response.

    An event's bytes are held until its line ends, then handed on (one event at a time: its
    parsed form is the caller's, as short-lived). Each chunk is searched once, so an event that
    comes in many chunks costs time in proportion to its size. An event within one chunk (the
    API server writes one an event) is a view of that chunk, not a copy: a fat pod's event is
    held once, not twice."""
    parts: list[bytes | memoryview] = []
    for chunk in response.stream(amt=None, decode_content=False):
        view, start = memoryview(chunk), 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line: bytes | memoryview = view[start:end]
            if parts:
                line, parts = b"".join([*parts, line]), []
            if not _BLANK.match(line):
                yield line
            start = end + 1
        if start < len(chunk):
            parts.append(view[start:])
    last = b"".join(parts)
    if not _BLANK.match(last):
        yield last


def decode(line: bytes | memoryview, reading: skim.Reading) -> dict[str, Any]:
    """One event: its type, and of its object what `reading` reads (a Status's code and message
    too: an ERROR event's object is one). Raises ValueError when it is not JSON."""
    text = str(line, "utf-8")  # a view's bytes decoded with no copy of them first
    if reading is skim.KEEP or not isinstance(reading, Mapping):
        event: dict[str, Any] = json.loads(text)
        return event
    event_reading = {**reading, "code": skim.KEEP, "message": skim.KEEP}
    read: dict[str, Any] = skim.loads(text, {"type": skim.KEEP, "object": event_reading})
    return read


def cut(response: Any) -> None:
    """Unblock a thread reading the watch response (stop() must not wait for the server)."""
    # Already released or closed: nobody is blocked on it.
    with contextlib.suppress(ValueError, RuntimeError, OSError):
        response.shutdown()


def check_not_short(started: float) -> None:
    """WatchError when a watch that brought no event ended within SHORT_WATCH_SECONDS of
    `started` (time.monotonic())."""
    lasted = time.monotonic() - started
    if lasted < SHORT_WATCH_SECONDS:
        raise WatchError(f"very short watch: ended after {lasted:.3f} s with no event")


def heartbeat_bound(timeouts: api.Timeouts, backoff_max: float) -> float:
    """The cache loop's heartbeat bound (agent.liveness): a turn is one call (a list page
    within the list timeout, a watch silent at most its idle read timeout, 130 s, each after
    connecting), or a back-off wait (1.2 x its longest); twice the longest of those, since a
    retried call may run past its first timeout."""
    call = api.SLOW_CONNECT_SECONDS + max(
        float(timeouts.settings.listTimeoutSeconds), timeouts.watch_idle_seconds
    )
    return 2 * max(call, 1.2 * backoff_max)
