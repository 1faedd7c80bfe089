"""Request framing (agent.serving.http): what is read, what is refused and with which status."""

from __future__ import annotations

import pytest

from agent.serving.http import FramingError, Response, parse_head

HEAD = 8 << 10


def parse(raw: bytes, max_body: int = 0) -> tuple[object, int] | None:
    return parse_head(raw, max_head=HEAD, max_body=max_body)


def test_a_complete_head_and_where_its_body_starts() -> None:
    raw = b"POST /v1/cni/add?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
    parsed = parse_head(raw, max_head=HEAD, max_body=10)
    assert parsed is not None
    head, body_at = parsed
    assert (head.method, head.target, head.version) == ("POST", "/v1/cni/add?x=1", "HTTP/1.1")
    assert head.headers == {"host": "a", "content-length": "2"}
    assert head.content_length == 2 and raw[body_at:] == b"{}"
    assert head.keep_alive


def test_incomplete_head_waits() -> None:
    assert parse(b"GET /healthz HTTP/1.1\r\nHost: a\r\n") is None


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /healthz\r\n\r\n", 400),
        (b"GET  /healthz HTTP/1.1\r\n\r\n", 400),
        (b"G(T /healthz HTTP/1.1\r\n\r\n", 400),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
        (b"GET healthz HTTP/1.1\r\n\r\n", 400),
        (b"GET /a\x01b HTTP/1.1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n folded: x\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nX: \xff\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: \xd9\xa3\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: 1\r\n\r\n", 413),
    ],
    ids=[
        "two-parts",
        "double-space",
        "method-not-a-token",
        "http2",
        "relative-target",
        "control-in-target",
        "header-without-colon",
        "folded-header",
        "non-ascii",
        "negative-length",
        "non-ascii-digits",
        "conflicting-lengths",
        "chunked",
        "body-where-none-is-read",
    ],
)
def test_refused_heads(raw: bytes, status: int) -> None:
    with pytest.raises(FramingError) as refused:
        parse(raw)
    assert refused.value.status == status


def test_a_head_over_the_limit_is_refused_before_it_ends() -> None:
    raw = b"GET /healthz HTTP/1.1\r\nX: " + b"a" * HEAD
    with pytest.raises(FramingError, match="longer than 8192 bytes") as refused:
        parse(raw)
    assert refused.value.status == 431


def test_a_body_over_the_limit_names_its_size() -> None:
    raw = b"POST /x HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n"
    with pytest.raises(FramingError, match="1048577 bytes is over 1 MiB"):
        parse(raw, max_body=1 << 20)


def test_repeated_equal_lengths_and_lists() -> None:
    raw = b"GET /a HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\nA: 1\r\nA: 2\r\n\r\n"
    parsed = parse(raw)
    assert parsed is not None
    head = parsed[0]
    assert head.headers == {"content-length": "0", "a": "1, 2"}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [
        ("HTTP/1.1", "", True),
        ("HTTP/1.1", "Connection: close\r\n", False),
        ("HTTP/1.1", "Connection: keep-alive, Close\r\n", False),
        ("HTTP/1.0", "", False),
        ("HTTP/1.0", "Connection: keep-alive\r\n", True),
    ],
)
def test_keep_alive(version: str, connection: str, keep: bool) -> None:
    parsed = parse(f"GET / {version}\r\n{connection}\r\n".encode())
    assert parsed is not None
    assert parsed[0].keep_alive is keep  # type: ignore[attr-defined]


def test_response_bytes() -> None:
    reply = Response(503, b"not ready\n", "text/plain", headers=(("Allow", "GET"),))
    assert reply.encode(keep_alive=False) == (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 10\r\nAllow: GET\r\nConnection: close\r\n\r\nnot ready\n"
    )
    assert reply.encode(keep_alive=True, head_only=True).endswith(b"Allow: GET\r\n\r\n")
