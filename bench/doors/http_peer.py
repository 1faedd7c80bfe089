"""A peer of one of the agent's HTTP doors, for the fuzz targets: sends the fuzzer's bytes on a
fresh connection (in the chunks it chose, then a half-close), reads what comes back until the
server closes or a short deadline, and judges it: only well-formed HTTP/1.1 replies, never a 500
(the server's answer to its own bug), and the door still answers a probe afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import Protocol

from bench.doors.finding import Finding

DICTIONARY = [
    b"GET /healthz HTTP/1.1\r\n\r\n",
    b"HTTP/1.0",
    b"\r\nContent-Length: ",
    b"\r\nTransfer-Encoding: chunked",
    b"\r\nConnection: close",
    b"\r\nConnection: keep-alive",
    b"\r\nExpect: 100-continue",
    b"\r\n\r\n",
    b"9" * 64,
    b"\x00",
    b"%",
]
"""Tokens the fuzzer may insert (libFuzzer's -dict): HTTP's own words and a long number."""
READ_DEADLINE = 0.5
BUG_STATUS = b" 500 "


def converse(connect: Callable[[], socket.socket], chunks: list[bytes]) -> bytes:
    try:
        sock = connect()
    except OSError as e:
        raise Finding(f"the door no longer accepts connections: {e}") from e
    try:
        sock.settimeout(READ_DEADLINE)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed on a refused request: what it said is below
                break
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        while True:
            try:
                data = sock.recv(65536)
            except (TimeoutError, OSError):
                break
            if not data:
                break
            received += data
        return bytes(received)
    finally:
        sock.close()


def judge(reply: bytes) -> None:
    if reply and not reply.startswith(b"HTTP/1.1 "):
        raise Finding(f"reply is not HTTP/1.1: {reply[:120]!r}")
    for line in reply.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and BUG_STATUS in line[8:13]:
            raise Finding(f"the server answered its own bug: {reply[:300]!r}")


def probe(connect: Callable[[], socket.socket], request: bytes, expect: bytes) -> None:
    """The door still serves: `request` answered with a status line starting `expect`. Run
    after every input, so that a finding is the input that broke the door, not the next one."""
    reply = converse(connect, [request])
    if not reply.startswith(expect):
        raise Finding(f"the door no longer answers: {reply[:200]!r}")


def chunks_of(data: bytes) -> list[bytes]:
    """The fuzzer's input as the chunks a peer sends: the first byte says how many cuts (0-3),
    two bytes each say where, the rest is the payload (so a seed is b"\\0" + its request)."""
    if not data:
        return []
    count = data[0] % 4
    offsets = [int.from_bytes(data[1 + 2 * i : 3 + 2 * i], "big") for i in range(count)]
    payload = data[1 + 2 * count :]
    points = sorted({o % (len(payload) + 1) for o in offsets})
    out, start = [], 0
    for point in points:
        out.append(payload[start:point])
        start = point
    out.append(payload[start:])
    return [c for c in out if c]


class Server(Protocol):
    def stop(self) -> None: ...


class UnixDoor:
    """A door on a unix socket in a private temporary dir (root-only, like the agent's own),
    as a fuzz target: `serve(path)` starts the server on it; each input is sent on a fresh
    connection and judged, then `probe` must still be answered 200."""

    def __init__(
        self, prefix: str, name: str, serve: Callable[[str], Server], probe: bytes
    ) -> None:
        self.prefix, self.name, self.serve, self.probe = prefix, name, serve, probe
        self.path = ""
        self.server: Server | None = None

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2)
        sock.connect(self.path)
        return sock

    def setup(self) -> None:
        self.path = os.path.join(tempfile.mkdtemp(prefix=self.prefix), self.name)
        self.server = self.serve(self.path)

    def teardown(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        if self.path:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)

    def one_input(self, data: bytes) -> None:
        judge(converse(self.connect, chunks_of(data)))
        probe(self.connect, self.probe, b"HTTP/1.1 200")
