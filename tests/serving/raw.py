"""HTTP/1.1 over a raw socket, for tests that send what no client library would (pipelined
batches, malformed heads) and read the replies as they come."""

from __future__ import annotations

import socket


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """`count` replies in the order they come (each whole), fewer if the server closes first."""
    replies: list[bytes] = []
    data = b""
    while len(replies) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            end = head_end + 4 + length
            if len(data) >= end:
                replies.append(data[:end])
                data = data[end:]
                continue
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return replies


def probe(port: int, source: str = "127.0.0.1") -> bytes:
    """The status line of a GET /healthz to 127.0.0.1:`port` from `source`; b"" when the
    connection was closed unanswered (refused over a budget)."""
    try:
        with socket.create_connection(
            ("127.0.0.1", port), timeout=5.0, source_address=(source, 0)
        ) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
            replies = read_responses(sock, 1)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    return replies[0].split(b"\r\n", 1)[0] if replies else b""


def read_response(sock: socket.socket) -> bytes:
    """The next reply (b"" when the server closed first)."""
    replies = read_responses(sock, 1)
    return replies[0] if replies else b""


def body(reply: bytes) -> bytes:
    return reply.split(b"\r\n\r\n", 1)[1]


def closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """The server closed it: EOF (or a reset) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
