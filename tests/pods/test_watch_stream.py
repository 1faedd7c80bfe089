"""A watch response's events, however the chunks of the response cut them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.pods import watch_stream


class Streamed:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: Any, decode_content: bool) -> Any:
        return iter(self.chunks)


def cut_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


EVENTS = [
    json.dumps({"type": "ADDED", "object": {"metadata": {"name": f"p{i}"}, "x": "y" * i}}).encode()
    for i in (0, 1, 700, 5000)
]


@pytest.mark.parametrize("size", [1, 2, 7, 4096, 1 << 20])
def test_events_whatever_the_chunks(size: int) -> None:
    data = b"\n".join(EVENTS) + b"\n\n  \n"
    assert list(watch_stream.events(Streamed(cut_every(data, size)))) == EVENTS


def test_a_last_event_without_its_newline() -> None:
    data = b"\n".join(EVENTS)
    assert list(watch_stream.events(Streamed(cut_every(data, 3)))) == EVENTS
    assert list(watch_stream.events(Streamed([]))) == []
