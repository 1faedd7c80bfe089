"""The event loop (agent.serving.loop) over real sockets: the cap, the timeouts, keep-alive and
pipelining, replies from worker threads, stop, and a flood costing no thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from agent.liveness import Liveness
from agent.serving.http import Exchange, Request, Response
from agent.serving.limits import Limits
from agent.serving.loop import Server
from testbed.wait import wait_for
from tests.serving.raw import body, closed, read_response, read_responses

FAST = Limits(max_connections=8, request_timeout=0.5, idle_timeout=1.0, write_timeout=0.5)


class Echo:
    """Answers the path; `gate` (when set) holds each answer until released."""

    def __init__(self, body_size: int = 0) -> None:
        self.body_size = body_size
        self.gate: threading.Event | None = None
        self.started = threading.Semaphore(0)
        self.threads: set[str] = set()

    def handle(self, request: Request) -> Response:
        self.threads.add(threading.current_thread().name)
        self.started.release()
        if self.gate is not None:
            self.gate.wait(10)
        body = b"x" * self.body_size if self.body_size else request.path.encode() + request.body
        return Response(200, body, "text/plain")

    def refuse(self, status: int, message: str) -> Response:
        return Response(status, message.encode(), "text/plain", close=True)


def tcp_listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


@pytest.fixture
def serve() -> Iterator[object]:
    servers: list[Server] = []

    def start(app: Echo, limits: Limits = FAST, **kw: object) -> tuple[Server, tuple[str, int]]:
        listener = tcp_listener()
        address = listener.getsockname()
        server = Server(listener, app, limits, name="test", **kw)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server, address

    yield start
    for server in servers:
        server.stop()


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    return sock


def get(sock: socket.socket, path: str = "/a", extra: str = "") -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode())
    return read_response(sock)


def test_keep_alive_and_pipelined_requests(serve) -> None:
    _, address = serve(Echo())
    with connect(address) as sock:
        assert get(sock, "/one").endswith(b"\r\n\r\n/one")
        assert get(sock, "/two").endswith(b"/two")
        sock.sendall(b"GET /p1 HTTP/1.1\r\n\r\nGET /p2 HTTP/1.1\r\n\r\n")
        assert [body(r) for r in read_responses(sock, 2)] == [b"/p1", b"/p2"]


def test_connection_close_and_http10_end_the_connection(serve) -> None:
    _, address = serve(Echo())
    with connect(address) as sock:
        assert b"Connection: close" in get(sock, extra="Connection: close\r\n")
        assert closed(sock)
    with connect(address) as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        assert read_response(sock).endswith(b"/old")
        assert closed(sock)


def test_over_the_cap_the_longest_waiting_goes(serve) -> None:
    server, address = serve(Echo(), replace(FAST, idle_timeout=30))
    idle = [connect(address) for _ in range(FAST.max_connections)]
    wait_for(lambda: server.connections == FAST.max_connections, "all accepted", 5)
    with connect(address) as newcomer:
        assert get(newcomer).endswith(b"/a")  # served at once
        assert closed(idle[0])  # the first accepted made room
        assert not closed(idle[1], timeout=0.1)
        assert server.connections == FAST.max_connections
    for sock in idle:
        sock.close()


def test_a_newcomer_is_refused_only_when_every_connection_is_being_answered(serve) -> None:
    app = Echo()
    app.gate = threading.Event()
    limits = replace(FAST, max_connections=2)
    _server, address = serve(app, limits, workers=4)
    busy = [connect(address) for _ in range(2)]
    for sock in busy:
        sock.sendall(b"GET /held HTTP/1.1\r\n\r\n")
    for _ in busy:
        assert app.started.acquire(timeout=5)
    with connect(address) as newcomer:
        assert closed(newcomer)
    app.gate.set()
    for sock in busy:
        assert read_response(sock).endswith(b"/held")
        sock.close()


def test_slowloris_is_closed_after_the_request_timeout(serve) -> None:
    server, address = serve(Echo())
    with connect(address) as sock:
        began = time.monotonic()
        sock.sendall(b"GET /slow HTTP/1.1\r\n")
        while time.monotonic() - began < 3:
            try:
                sock.sendall(b"X-a: b\r\n")  # a byte now and then, never the end of the head
            except OSError:
                break
            if closed(sock, timeout=0.1):
                break
        took = time.monotonic() - began
    assert FAST.request_timeout <= took < FAST.request_timeout + 1.0
    wait_for(lambda: server.connections == 0, "the connection to be gone", 2)


def test_idle_connections_are_closed_after_the_idle_timeout(serve) -> None:
    _server, address = serve(Echo())
    with connect(address) as sock:
        assert get(sock).endswith(b"/a")
        began = time.monotonic()
        assert closed(sock, timeout=3)
        assert FAST.idle_timeout <= time.monotonic() - began + 0.05 < FAST.idle_timeout + 1.0


def test_a_peer_that_never_reads_its_reply_is_closed_after_the_write_timeout(serve) -> None:
    server, address = serve(Echo(body_size=32 << 20))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    with sock:
        sock.sendall(b"GET /big HTTP/1.1\r\n\r\n")
        wait_for(lambda: server.connections == 0, "the stuck writer to be closed", 3)


def test_a_head_over_the_limit_is_answered_431_and_closed(serve) -> None:
    _, address = serve(Echo())
    with connect(address) as sock:
        sock.sendall(b"GET /a HTTP/1.1\r\nX: " + b"a" * (9 << 10))
        reply = read_response(sock)
        assert reply.startswith(b"HTTP/1.1 431 ")
        assert closed(sock)


def test_replies_come_from_the_workers_and_stop_sends_them(serve) -> None:
    app = Echo()
    app.gate = threading.Event()
    server, address = serve(app, replace(FAST, max_body_bytes=16), workers=2)
    with connect(address) as sock:
        sock.sendall(b"POST /w HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        assert app.started.acquire(timeout=5)
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        time.sleep(0.2)
        app.gate.set()
        reply = read_response(sock)
        stopping.join(10)
    assert reply.endswith(b"/wabc") and b"Connection: close" in reply
    assert app.threads and all(name.startswith("test-work") for name in app.threads)


def test_peer_check_refuses_at_accept(tmp_path) -> None:
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    server = Server(listener, Echo(), FAST, name="test", check_peer=lambda _s: "not you")
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            assert closed(sock)
    finally:
        server.stop()


def test_a_thousand_connections_cost_no_thread(serve) -> None:
    before = threading.active_count()
    server, address = serve(Echo(), replace(FAST, max_connections=64, idle_timeout=30))
    flood = [connect(address) for _ in range(1000)]
    try:
        wait_for(lambda: server.connections == 64, "the cap to hold", 10)
        assert threading.active_count() == before + 1  # the loop's own thread only
        with connect(address) as sock:
            assert get(sock).endswith(b"/a")
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.parametrize("workers", [0, 4], ids=["on-the-loop", "in-workers"])
def test_hundreds_of_pipelined_requests_in_one_write_are_all_answered_in_order(
    serve, workers: int
) -> None:
    _, address = serve(Echo(), replace(FAST, idle_timeout=10), workers=workers)
    count = 1000
    with connect(address) as sock:
        # No Host: what hand-written probes send (answered as they always were).
        sock.sendall(b"".join(b"GET /%d HTTP/1.1\r\n\r\n" % n for n in range(count)))
        replies = read_responses(sock, count)
        assert [body(r) for r in replies] == [b"/%d" % n for n in range(count)]
        assert get(sock, "/after").endswith(b"/after")  # the same connection goes on
    with connect(address) as sock:
        assert get(sock, "/next").endswith(b"/next")


def test_pipelined_requests_do_not_starve_another_connection(serve) -> None:
    app = Echo()
    _, address = serve(app, replace(FAST, idle_timeout=10))
    with connect(address) as flood, connect(address) as other:
        flood.sendall(b"GET /f HTTP/1.1\r\nHost: t\r\n\r\n" * 2000)
        assert get(other, "/other").endswith(b"/other")
        assert len(read_responses(flood, 2000)) == 2000


def test_a_content_length_of_4400_digits_is_answered_400_and_the_server_goes_on(serve) -> None:
    _, address = serve(Echo())
    with connect(address) as sock:
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: t\r\nContent-Length: " + b"9" * 4400 + b"\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 400 ")
        assert closed(sock)
    with connect(address) as sock:
        assert get(sock).endswith(b"/a")


class Faulty(Echo):
    """Raises for /boom, in its answer and again in the refusal that would report it."""

    def handle(self, request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("a bug in the app")
        return super().handle(request)

    def refuse(self, status: int, message: str) -> Response:
        if status == 500:
            raise RuntimeError("a bug in the refusal too")
        return super().refuse(status, message)


@pytest.mark.parametrize("workers", [0, 2], ids=["on-the-loop", "in-workers"])
def test_an_app_failing_for_one_connection_ends_that_one_only(serve, workers: int) -> None:
    _, address = serve(Faulty(), replace(FAST, idle_timeout=10), workers=workers)
    with connect(address) as bystander:
        assert get(bystander, "/before").endswith(b"/before")
        for _ in range(3):
            with connect(address) as victim:
                victim.sendall(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n")
                assert closed(victim)
        assert get(bystander, "/after").endswith(b"/after")
    with connect(address) as sock:
        assert get(sock).endswith(b"/a")


def test_a_parser_failing_for_one_connection_answers_500_and_ends_that_one_only(
    serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Exchange.feed

    def feed(self: Exchange, data: bytes, now: float | None = None) -> None:
        if b"X-Break: parser" in data:
            raise IndexError("a bug in the parser")
        original(self, data, now)

    monkeypatch.setattr(Exchange, "feed", feed)
    _, address = serve(Echo(), replace(FAST, idle_timeout=10))
    with connect(address) as bystander:
        assert get(bystander, "/before").endswith(b"/before")
        with connect(address) as victim:
            reply = get(victim, extra="X-Break: parser\r\n")
            assert reply.startswith(b"HTTP/1.1 500 ") and b"Connection: close" in reply
            assert closed(victim)
        assert get(bystander, "/after").endswith(b"/after")


def test_a_serving_loop_that_dies_is_reported_to_liveness() -> None:
    liveness = Liveness()
    server = Server(tcp_listener(), Echo(), FAST, name="doomed", workers=1, liveness=liveness)
    server.start()
    try:
        server._pool.shutdown(1.0)  # type: ignore[union-attr]  # the pool gone under the loop
        address = server._listener.sock.getsockname()
        with connect(address) as sock:
            sock.sendall(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
            assert closed(sock)
        wait_for(lambda: liveness.failing(), "the loop's end to be reported", 5)
        [(name, why)] = liveness.failing()
        assert name == "doomed" and "worker pool is gone" in why
    finally:
        server.stop()
