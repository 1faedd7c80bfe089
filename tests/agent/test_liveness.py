"""A hung loop fails liveness: each long-running loop's heartbeat, judged against its bound
(agent.liveness); a loop that turns, however busy, and a call waiting within its own timeout do
not."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.background import BackgroundLoop
from agent.http_server import HttpServer
from agent.kube import api
from agent.liveness import Liveness
from agent.pods.pod_cache import PodCache
from agent.pods.watch_stream import heartbeat_bound
from agent.serving import limits
from agent.serving.http import Request, Response
from agent.serving.loop import Server
from testbed.agent_host import http_get
from testbed.wait import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hangs_of(loop: str) -> float:
    return REGISTRY.get_sample_value("istio_cni_loop_hangs_total", {"loop": loop}) or 0.0


def test_a_heart_silent_past_its_bound_fails_until_it_beats_again() -> None:
    clock = Clock()
    liveness = Liveness(clock)
    heart = liveness.heart("silent-loop", 10.0)
    before = hangs_of("silent-loop")
    clock.now += 10.0
    assert liveness.failing() == []
    clock.now += 5.0
    assert liveness.failing() == [("silent-loop", "no turn for 15 s (bound 10 s)")]
    assert liveness.failing() == [("silent-loop", "no turn for 15 s (bound 10 s)")]
    assert hangs_of("silent-loop") == before + 1  # once per silence, however often probed
    heart.beat()
    assert liveness.failing() == []
    clock.now += 11.0
    assert liveness.failing() != []
    assert hangs_of("silent-loop") == before + 2
    heart.quiet()  # stopped: not judged
    assert liveness.failing() == []


def test_a_pool_is_judged_by_its_oldest_item_in_flight_never_by_idleness() -> None:
    clock = Clock()
    liveness = Liveness(clock)
    pool = liveness.pool("some-workers", 10.0)
    before = hangs_of("some-workers")
    clock.now += 100.0  # idle for ten bounds: no item, nothing stuck
    assert liveness.failing() == []
    pool.begin()  # this thread's item

    def later_item() -> None:
        clock.now += 6.0
        pool.begin()

    other = threading.Thread(target=later_item)
    other.start()
    other.join()  # another worker's item, begun 6 s later and left running
    clock.now += 3.0
    assert liveness.failing() == []  # 9 s and 3 s: within the bound
    clock.now += 5.0
    assert liveness.failing() == [("some-workers", "one item running for 14 s (bound 10 s)")]
    assert liveness.failing() != []
    assert hangs_of("some-workers") == before + 1
    pool.end()  # the oldest ends: the other has run 8 s
    assert liveness.failing() == []
    clock.now += 3.0
    assert liveness.failing() == [("some-workers", "one item running for 11 s (bound 10 s)")]
    assert hangs_of("some-workers") == before + 2
    pool.quiet()
    assert liveness.failing() == []


@pytest.fixture
def probed() -> Iterator[tuple[Liveness, HttpServer]]:
    liveness = Liveness()
    srv = HttpServer(port=0, host="127.0.0.1", loops=liveness.failing)
    srv.start()
    try:
        yield liveness, srv
    finally:
        srv.stop()


def test_a_loop_made_to_hang_fails_healthz_naming_it_within_its_bound(
    probed: tuple[Liveness, HttpServer],
) -> None:
    liveness, srv = probed
    hang = threading.Event()
    released = threading.Event()

    def body() -> None:
        while not loop.stopping.wait(0.01):
            loop.beat()
            if hang.is_set():
                released.wait()  # the hook: blocked as on a lock nobody releases

    loop = BackgroundLoop("hanging-loop", body, liveness=liveness, heartbeat=0.5)
    loop.start()
    try:
        time.sleep(0.8)
        assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
        hang.set()
        hung_at = time.monotonic()
        wait_for(lambda: http_get(srv.bound_port, "/healthz")[0] == 503, "a 503", 5, interval=0.05)
        assert time.monotonic() - hung_at < 0.5 + 0.5  # the bound, and a probe's turn
        text = http_get(srv.bound_port, "/healthz")[1]
        assert text.startswith("not live: hanging-loop\nhanging-loop: no turn for ")
        released.set()  # turning again: live again
        wait_for(lambda: http_get(srv.bound_port, "/healthz")[0] == 200, "a 200", 5, interval=0.05)
    finally:
        released.set()
        loop.stop()
    assert liveness.failing() == []  # a stopped loop is not judged


def test_a_busy_loop_that_turns_stays_live(probed: tuple[Liveness, HttpServer]) -> None:
    liveness, srv = probed

    def step() -> None:
        until = time.monotonic() + 0.2  # each step busy for 0.2 s of a 0.5 s bound
        while time.monotonic() < until:
            sum(range(1000))

    loop = BackgroundLoop.every(
        "busy-loop", 0.01, step, failed="busy step failed", step_bound=0.49, liveness=liveness
    )
    loop.start()
    try:
        for _ in range(15):
            assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
            time.sleep(0.1)
    finally:
        loop.stop()


class BlockingApp:
    """The app of a serving loop whose handler blocks the loop's own thread until released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def handle(self, request: Request) -> Response:
        if request.path == "/block":
            self.released.wait()
        return Response(200, b"ok\n", "text/plain")

    def refuse(self, status: int, message: str) -> Response:
        return Response(status, message.encode(), "text/plain", close=True)


def test_a_serving_loop_blocked_in_a_handler_fails_liveness() -> None:
    liveness = Liveness()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    app = BlockingApp()
    server = Server(
        listener, app, limits.HTTP, name="blocked-door", liveness=liveness, heartbeat=0.5
    )
    server.start()
    client = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        time.sleep(0.8)
        assert liveness.failing() == []  # idle rounds beat too
        client.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: liveness.failing(), "the loop's hang to be seen", 5, interval=0.05)
        ((name, why),) = liveness.failing()
        assert name == "blocked-door" and why.startswith("no turn for ")
    finally:
        app.released.set()
        client.close()
        server.stop()


@dataclass
class Reply:
    data: bytes


class HeldWatch:
    """A watch response whose stream blocks until cut: a read waiting within its timeout, or
    past it (a read with no timeout)."""

    def __init__(self, reading: threading.Event) -> None:
        self._reading = reading
        self._cut = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        self._reading.set()
        self._cut.wait()
        yield from ()

    def shutdown(self) -> None:
        self._cut.set()

    def release_conn(self) -> None:
        pass


class ListThenHeldWatch:
    def __init__(self) -> None:
        self.reading = threading.Event()

    def list_pod_for_all_namespaces(self, **options: Any) -> Any:
        if options.get("watch"):
            return HeldWatch(self.reading)
        return Reply(b'{"metadata": {"resourceVersion": "7"}, "items": []}')


def test_the_pod_cache_waiting_within_its_watch_timeout_is_live_past_it_hung() -> None:
    """The bound comes from the loop's own timeouts: a watch silent for its whole idle read
    timeout (130 s) is a normal turn; silent far past it, the loop is stuck."""
    clock = Clock()
    liveness = Liveness(clock)
    core = ListThenHeldWatch()
    cache = PodCache(core, "node-1", liveness=liveness)
    bound = heartbeat_bound(api.DEFAULT_TIMEOUTS, 30.0)
    assert bound >= 2 * api.WATCH_IDLE_SECONDS
    cache.start()
    try:
        assert core.reading.wait(5)
        clock.now += api.SLOW_CONNECT_SECONDS + api.WATCH_IDLE_SECONDS + 30.0
        assert liveness.failing() == []
        clock.now += bound
        ((name, why),) = liveness.failing()
        assert name == "pod-cache" and why.startswith("no turn for ")
    finally:
        cache.stop()
    assert liveness.failing() == []
