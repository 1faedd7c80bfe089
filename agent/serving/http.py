"""HTTP/1.1 on one connection, free of sockets: bytes in, requests out; replies in, bytes out.

The reading is h11's (python-hyper's sans-IO state machine): every byte a peer sends goes
through it, and whatever it refuses (a malformed request line or header, a Content-Length that
is not 1 to 20 digits, conflicting lengths, two Host lines, a head still incomplete past the
limit) is a FramingError, never another exception. On top of it each door is stricter
than HTTP needs (a peer that is not kubelet, Prometheus, curl or the plugin gets a 4xx and the
connection closed): HTTP/1.0 or 1.1 only, an absolute path as the target, an ASCII head within
the server's limit, a declared body within its limit, and no Transfer-Encoding at all.

Pipelined requests are a queue: `next_request` hands out one complete request at a time and
none while its reply is unsent.

One leniency over h11: an HTTP/1.1 request without Host is read as if it had an empty one
(h11 answers it 400, as RFC 9112 asks). No door here routes by host, and the hand-written probes
and scripts that omit it were always answered; the head is still h11's to read (`_HostDefault`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11
from h11._readers import maybe_read_from_IDLE_client as _h11_read_head

from agent.errors import AgentError

_HTTP_VERSIONS = (b"1.0", b"1.1")
_REQUEST_LINE_EXTRA = len(b"  HTTP/1.1\r\n")
_HEADER_LINE_EXTRA = len(b": \r\n")


class FramingError(AgentError):
    """A request the server will not read further: answered with `status`, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str] = field(default_factory=dict)
    """Names lower-cased; a repeated header is one comma-separated list (RFC 9110 5.3)."""
    body: bytes = b""
    received: float | None = None
    """When its last byte had arrived at the latest (a monotonic time, given with the bytes
    that completed it): what was built after it is news to this request. None: unknown."""

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str
    close: bool = False
    """Close the connection once sent (the request left it unusable)."""
    headers: tuple[tuple[str, str], ...] = field(default=())

    def encode(self, *, keep_alive: bool, head_only: bool = False) -> bytes:
        """The reply's bytes outside any exchange: a refusal or an internal error, after which
        the connection is closed whatever state its exchange was left in."""
        lines = [
            f"HTTP/1.1 {self.status} {_reason(self.status)}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


class _HostDefault:
    """h11's receive buffer as its request-head reader sees it, but for one thing: the head of
    an HTTP/1.1 request without a Host line gets an empty one."""

    def __init__(self, buf: Any) -> None:
        self._buf = buf

    def maybe_extract_lines(self) -> list[bytearray] | None:
        lines: list[bytearray] | None = self._buf.maybe_extract_lines()
        if not lines or not lines[0].endswith(b" HTTP/1.1"):
            return lines
        if not any(line[:5].lower() == b"host:" for line in lines[1:]):
            lines.append(bytearray(b"Host: "))
        return lines

    def is_next_line_obviously_invalid_request_line(self) -> bool:
        return bool(self._buf.is_next_line_obviously_invalid_request_line())


def _read_head(buf: Any) -> h11.Request | None:
    return _h11_read_head(_HostDefault(buf))  # type: ignore[arg-type]  # the reader's view


class _Connection(h11.Connection):
    """h11's server side with `_read_head` as the reader of request heads (h11 picks a reader
    per state through `_get_io_object`; h11 is pinned below 0.17 for this hook)."""

    def _get_io_object(self, role: Any, event: Any, io_dict: Any) -> Any:
        io = super()._get_io_object(role, event, io_dict)
        return _read_head if io is _h11_read_head else io


class Exchange:
    """One connection's requests and replies, in order."""

    def __init__(self, *, max_head: int, max_body: int) -> None:
        self._h = _Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self._max_head = max_head
        self._max_body = max_body
        self._request: Request | None = None
        """The request being read: its head, its body still to come."""
        self._body = bytearray()
        self._method = ""
        """Of the request last handed out: a reply to HEAD carries no body."""
        self._fed_at: float | None = None

    def feed(self, data: bytes, now: float | None = None) -> None:
        """`data`, received by `now` (a monotonic time, handed on as Request.received)."""
        self._h.receive_data(data)
        self._fed_at = now

    def next_request(self) -> Request | None:
        """The next complete request; None while more bytes are needed or while the last one's
        reply is unsent. Raises FramingError for a request the server will not read."""
        while True:
            try:
                event = self._h.next_event()
            except h11.RemoteProtocolError as e:
                raise FramingError(e.error_status_hint, str(e)[:200]) from None
            except ValueError:  # a number past Python's digit limit, were h11 to parse one
                raise FramingError(400, "malformed request head") from None
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Request):
                self._request = self._head(event)
                self._body = bytearray()
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage) and self._request is not None:
                request, self._request = self._request, None
                body, self._body = bytes(self._body), bytearray()
                return Request(request.method, request.target, request.headers, body, self._fed_at)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def reading(self) -> bool:
        """A request is begun: its head or its body is partly received."""
        return self._request is not None or bool(self._h.trailing_data[0])

    def continue_reply(self) -> bytes:
        """`100 Continue` when the request being read waits for it before sending its body
        (curl does for bodies over 1 KiB); b"" otherwise."""
        if self._request is None or not self._h.they_are_waiting_for_100_continue:
            return b""
        return self._h.send(
            h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
        )

    def reply(self, response: Response, *, close: bool) -> bytes:
        """The reply to the request last handed out; its body left out for a HEAD request."""
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        if close:
            headers.append(("Connection", "close"))
        reason = _reason(response.status).encode("latin-1")
        out = self._h.send(
            h11.Response(status_code=response.status, headers=headers, reason=reason)
        )
        if response.body and self._method != "HEAD":
            out += self._h.send(h11.Data(data=response.body))
        return out + self._h.send(h11.EndOfMessage())

    def next_cycle(self) -> bool:
        """After a reply is sent: True when the connection may carry the next request (then
        ready for it), False when it must be closed (the peer or the reply asked to)."""
        if self._h.our_state is not h11.DONE or self._h.their_state is not h11.DONE:
            return False
        self._h.start_next_cycle()
        return True

    def _head(self, event: h11.Request) -> Request:
        """The head of a request, checked against this door's rules (raises FramingError)."""
        if event.http_version not in _HTTP_VERSIONS:
            version = event.http_version.decode("ascii", "replace")
            raise FramingError(505, f"HTTP version {version!r} is not served")
        target = bytes(event.target)
        if not target.startswith(b"/") or not all(0x21 <= c <= 0x7E for c in target):
            raise FramingError(400, "request target must be an absolute path")
        raw = event.headers.raw_items()
        size = len(event.method) + len(target) + _REQUEST_LINE_EXTRA
        size += sum(len(name) + len(value) + _HEADER_LINE_EXTRA for name, value in raw)
        if size > self._max_head:
            raise FramingError(431, f"request head longer than {self._max_head} bytes")
        headers = _headers(event.headers)
        if "transfer-encoding" in headers:
            raise FramingError(411, "chunked request bodies are not accepted")
        length = int(headers.get("content-length", "0"))  # h11 checked: 1 to 20 digits
        if length > self._max_body:
            limit = f"over {_size(self._max_body)}" if self._max_body else "not accepted here"
            raise FramingError(413, f"request body of {length} bytes is {limit}")
        self._method = event.method.decode("ascii")
        return Request(self._method, target.decode("ascii"), headers)


def _headers(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in fields:
        try:
            key, text = name.decode("ascii"), value.decode("ascii")
        except UnicodeDecodeError:
            raise FramingError(400, "request head is not ASCII") from None
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return headers


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n} bytes"


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
