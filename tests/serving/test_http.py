"""One connection's HTTP (agent.serving.http.Exchange, on h11): what is read, what is refused and
with which status, pipelined requests one at a time, and the bytes of a reply."""

from __future__ import annotations

import pytest

from agent.serving.http import Exchange, FramingError, Request, Response

HEAD = 8 << 10
OK = Response(200, b"hi\n", "text/plain")


def exchange(max_body: int = 0) -> Exchange:
    return Exchange(max_head=HEAD, max_body=max_body)


def read(raw: bytes, max_body: int = 0) -> Request | None:
    ex = exchange(max_body)
    ex.feed(raw)
    return ex.next_request()


def test_a_complete_request_with_its_body() -> None:
    raw = b"POST /v1/cni/add?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"
    request = read(raw, max_body=10)
    assert request is not None
    assert (request.method, request.target, request.path) == (
        "POST",
        "/v1/cni/add?x=1",
        "/v1/cni/add",
    )
    assert request.headers == {"host": "a", "content-length": "2"}
    assert request.body == b"{}"


def test_an_incomplete_request_waits_for_its_bytes() -> None:
    ex = exchange(max_body=10)
    assert not ex.reading()
    ex.feed(b"POST /a HTTP/1.1\r\nHost: a\r\n")
    assert ex.next_request() is None and ex.reading()
    ex.feed(b"Content-Length: 3\r\n\r\nab")
    assert ex.next_request() is None and ex.reading()
    ex.feed(b"c")
    request = ex.next_request()
    assert request is not None and request.body == b"abc"
    assert not ex.reading()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /healthz\r\n\r\n", 400),
        (b"GET  /healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"G(T /healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        (b"GET healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET http://a/healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n folded: x\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: \xff\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: \xd9\xa3\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"1" * 4400 + b"\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"0" * 21 + b"\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (
            b"GET /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n"
            b"\r\n",
            411,
        ),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", 413),
    ],
    ids=[
        "two-parts",
        "double-space",
        "method-not-a-token",
        "http2",
        "relative-target",
        "absolute-form-target",
        "asterisk-target",
        "control-in-target",
        "delete-in-target",
        "header-without-colon",
        "folded-header",
        "non-ascii",
        "two-hosts",
        "negative-length",
        "non-ascii-digits",
        "length-of-4400-digits",
        "length-of-21-digits",
        "conflicting-lengths",
        "conflicting-length-list",
        "chunked",
        "chunked-and-length",
        "other-transfer-coding",
        "body-where-none-is-read",
    ],
)
def test_refused_requests(raw: bytes, status: int) -> None:
    with pytest.raises(FramingError) as refused:
        read(raw)
    assert refused.value.status == status


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", ""),
        (b"GET /healthz HTTP/1.1\r\nHOST: n\r\n\r\n", "n"),
        (b"GET /healthz HTTP/1.0\r\n\r\n", None),
    ],
    ids=["http11-without", "http11-with", "http10-without"],
)
def test_a_missing_host_is_read_as_an_empty_one(raw: bytes, host: str | None) -> None:
    request = read(raw)
    assert request is not None and request.headers.get("host") == host


def test_a_head_over_the_limit_is_refused_before_it_ends() -> None:
    with pytest.raises(FramingError) as refused:
        read(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: " + b"a" * HEAD)
    assert refused.value.status == 431


def test_a_head_over_the_limit_is_refused_when_it_comes_whole() -> None:
    with pytest.raises(FramingError, match="longer than 8192 bytes") as refused:
        read(b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: " + b"a" * HEAD + b"\r\n\r\n")
    assert refused.value.status == 431


def test_a_body_over_the_limit_names_its_size() -> None:
    raw = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1048577\r\n\r\n"
    with pytest.raises(FramingError, match="1048577 bytes is over 1 MiB"):
        read(raw, max_body=1 << 20)


def test_repeated_equal_lengths_and_lists() -> None:
    raw = b"GET /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\nContent-Length: 0\r\n"
    raw += b"A: 1\r\nA: 2\r\n\r\n"
    request = read(raw)
    assert request is not None
    assert request.headers == {"host": "h", "content-length": "0", "a": "1, 2"}


def test_pipelined_requests_come_one_at_a_time_in_order() -> None:
    ex = exchange()
    ex.feed(b"".join(b"GET /%d HTTP/1.1\r\nHost: a\r\n\r\n" % n for n in range(300)))
    for n in range(300):
        request = ex.next_request()
        assert request is not None and request.path == f"/{n}"
        assert ex.next_request() is None  # none while its reply is unsent
        ex.reply(OK, close=False)
        assert ex.next_cycle()
    assert ex.next_request() is None and not ex.reading()


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [
        ("HTTP/1.1", "", True),
        ("HTTP/1.1", "Connection: close\r\n", False),
        ("HTTP/1.1", "Connection: keep-alive, Close\r\n", False),
        ("HTTP/1.0", "", False),
        ("HTTP/1.0", "Connection: keep-alive\r\n", False),  # h11: HTTP/1.0 is never kept
    ],
)
def test_keep_alive(version: str, connection: str, keep: bool) -> None:
    ex = exchange()
    ex.feed(f"GET / {version}\r\nHost: a\r\n{connection}\r\n".encode())
    assert ex.next_request() is not None
    out = ex.reply(OK, close=False)
    assert (b"Connection: close" in out) is not keep
    assert ex.next_cycle() is keep


def test_a_reply_that_closes_says_so() -> None:
    ex = exchange()
    ex.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert ex.next_request() is not None
    assert b"\r\nConnection: close\r\n" in ex.reply(OK, close=True)
    assert not ex.next_cycle()


def test_reply_bytes_and_head() -> None:
    reply = Response(503, b"not ready\n", "text/plain", headers=(("Allow", "GET"),))
    ex = exchange()
    ex.feed(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nHEAD /a HTTP/1.1\r\nHost: a\r\n\r\n")
    assert ex.next_request() is not None
    assert ex.reply(reply, close=False) == (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 10\r\nAllow: GET\r\n\r\nnot ready\n"
    )
    assert ex.next_cycle()
    request = ex.next_request()
    assert request is not None and request.method == "HEAD"
    assert ex.reply(reply, close=False).endswith(b"Content-Length: 10\r\nAllow: GET\r\n\r\n")


def test_continue_only_while_the_body_is_awaited() -> None:
    ex = exchange(max_body=10)
    ex.feed(b"POST /a HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert ex.next_request() is None
    assert ex.continue_reply() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert ex.continue_reply() == b""  # once
    ex.feed(b"{}")
    request = ex.next_request()
    assert request is not None and request.body == b"{}"
    sent_along = exchange(max_body=10)
    sent_along.feed(
        b"POST /a HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert sent_along.next_request() is not None
    assert sent_along.continue_reply() == b""


def test_refusal_bytes_outside_an_exchange() -> None:
    reply = Response(400, b"bad\n", "text/plain")
    assert reply.encode(keep_alive=False) == (
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 4\r\nConnection: close\r\n\r\nbad\n"
    )
