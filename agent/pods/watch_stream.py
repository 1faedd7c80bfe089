"""Reading a watch response as it streams: the API server sends one JSON event per line over a
chunked response that stays open until the watch ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


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
