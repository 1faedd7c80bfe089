"""HTTP/1.1 framing, free of sockets: a request head parsed from bytes, a reply turned into bytes.

Strict on purpose (a peer that is not kubelet, Prometheus, curl or the plugin gets a 4xx and the
connection closed): one space between the three parts of the request line, HTTP/1.0 or 1.1,
CRLF line ends, no folded headers, a Content-Length of digits only (one value), no
Transfer-Encoding at all, and the head within the server's limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from agent.errors import AgentError

HEAD_END = b"\r\n\r\n"
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class FramingError(AgentError):
    """A request the server will not read further: answered with `status`, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Head:
    method: str
    target: str
    version: str
    headers: Mapping[str, str]
    """Names lower-cased."""

    @property
    def content_length(self) -> int:
        return int(self.headers.get("content-length", "0"))

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


@dataclass(frozen=True)
class Request:
    head: Head
    body: bytes = b""

    @property
    def method(self) -> str:
        return self.head.method

    @property
    def path(self) -> str:
        return self.head.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str
    close: bool = False
    """Close the connection once sent (the request left it unusable)."""
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self, *, keep_alive: bool, head_only: bool = False) -> bytes:
        reason = _reason(self.status)
        lines = [
            f"HTTP/1.1 {self.status} {reason}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def parse_head(buf: bytes | bytearray, *, max_head: int, max_body: int) -> tuple[Head, int] | None:
    """The head at the start of `buf` and the offset of its body; None while incomplete.
    Raises FramingError for a head over `max_head` bytes or one this server does not read."""
    end = buf.find(HEAD_END, 0, max_head + len(HEAD_END))
    if end < 0:
        if len(buf) > max_head:
            raise FramingError(431, f"request head longer than {max_head} bytes")
        return None
    try:
        text = bytes(buf[:end]).decode("ascii")
    except UnicodeDecodeError:
        raise FramingError(400, "request head is not ASCII") from None
    line, *header_lines = text.split("\r\n")
    head = Head(*_request_line(line), _headers(header_lines))
    _check_body(head, max_body)
    return head, end + len(HEAD_END)


def _request_line(line: str) -> tuple[str, str, str]:
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN:
        raise FramingError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise FramingError(505, f"HTTP version {version[:16]!r} is not served")
    if not target.startswith("/") or any(c <= " " or c == "\x7f" for c in target):
        raise FramingError(400, "request target must be an absolute path")
    return method, target, version


def _headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN:
            raise FramingError(400, "malformed header line")
        key, value = name.lower(), value.strip(" \t")
        if key not in headers:
            headers[key] = value
        elif key == "content-length":
            if headers[key] != value:
                raise FramingError(400, "conflicting Content-Length headers")
        else:  # a repeated header is one list (RFC 9110 5.3)
            headers[key] = f"{headers[key]}, {value}"
    return headers


def _check_body(head: Head, max_body: int) -> None:
    if "transfer-encoding" in head.headers:
        raise FramingError(411, "chunked request bodies are not accepted")
    length = head.headers.get("content-length", "0")
    if not length.isdigit() or not length.isascii():
        raise FramingError(400, "Content-Length is not a number")
    if int(length) > max_body:
        limit = f"over {_size(max_body)}" if max_body else "not accepted here"
        raise FramingError(413, f"request body of {int(length)} bytes is {limit}")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
