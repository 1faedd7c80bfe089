"""Reading a watch response as it streams: the API server sends one JSON event per line over a
chunked response that stays open until the watch ends."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from agent.errors import WatchError

SHORT_WATCH_SECONDS = 1.0
"""A watch that ends sooner than this with no event is an error (backed off), as in client-go's
reflector: an API server or proxy that answers 200 and closes at once must not be re-asked in a
tight loop."""


def events(response: Any) -> Iterator[bytes]:
    """Newline-separated JSON events of a chunked watch response."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


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
