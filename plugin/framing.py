"""The plugin's HTTP/1.1 client framing: one request per connection, a bounded response read.

A few lines instead of http.client (~60 ms of import on every pod start). Only the plugin uses
this module; the agent serves HTTP with the standard library's server and shares only the
message format in `plugin.wire`. Standard library only.
"""

from __future__ import annotations

from plugin.wire import MAX_BODY, WireError

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable

MAX_HEAD = 64 << 10
"""Longest response head read before giving up (a peer that is not our agent)."""


def http_request(method: str, path: str, body: bytes | None = None) -> bytes:
    """One request on its own connection (`Connection: close`), so curl can replay it."""
    head = [f"{method} {path} HTTP/1.1", "Host: istio-cni-agent", "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")


class HttpResponse:
    """Status, lower-cased headers, body (at most the caller's limit) and whether it was cut."""

    __slots__ = ("body", "headers", "status", "truncated")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, truncated: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.truncated = truncated


def read_http_response(recv: Callable[[int], bytes], *, limit: int = MAX_BODY) -> HttpResponse:
    """Read one response through `recv` (socket.recv); the body is cut at `limit` bytes.

    Raises WireError for a response that is not HTTP/1.x. Chunked bodies are decoded.
    """
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise WireError(f"HTTP response head longer than {MAX_HEAD} bytes")
        data = recv(65536)
        if not data:
            raise WireError("connection closed before a complete HTTP response head")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, truncated = _read_chunked(rest, recv, limit)
    else:
        body, truncated = _read_plain(rest, recv, limit, headers.get("content-length"))
    return HttpResponse(int(parts[1]), headers, body, truncated)


def _read_plain(
    buf: bytes, recv: Callable[[int], bytes], limit: int, length: str | None
) -> tuple[bytes, bool]:
    want = int(length) if length and length.isdigit() else None
    while (want is None or len(buf) < want) and len(buf) <= limit:
        data = recv(65536)
        if not data:
            break
        buf += data
    if want is not None:
        buf = buf[:want]
    return (buf[:limit], True) if len(buf) > limit else (buf, False)


def _read_chunked(buf: bytes, recv: Callable[[int], bytes], limit: int) -> tuple[bytes, bool]:
    body = b""
    while True:
        while b"\r\n" not in buf:
            data = recv(65536)
            if not data:
                return body, False
            buf += data
        size_line, _, buf = buf.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
        except ValueError as e:
            raise WireError(f"bad chunk size line {size_line[:40]!r}") from e
        if size == 0:
            return body, False
        while len(buf) < size + 2:
            data = recv(65536)
            if not data:
                return (body + buf[:size])[:limit], len(body) + len(buf[:size]) > limit
            buf += data
        body += buf[:size]
        buf = buf[size + 2 :]
        if len(body) > limit:
            return body[:limit], True
