"""/healthz, /readyz, /metrics served from the agent process."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from agent import metrics
from agent.background import BackgroundLoop
from agent.http_server import HttpServer, MetricsPage
from agent.liveness import LIVENESS, Liveness
from testbed.agent_host import http_get
from testbed.wait import wait_for
from tests.serving.raw import body, closed, read_response, read_responses


class Flag:
    """A failing readiness check's reason, or None while it passes."""

    def __init__(self, value: str | None) -> None:
        self.value = value


def _broken() -> list[tuple[str, str]]:
    raise RuntimeError("boom")


@pytest.fixture
def server() -> Iterator[tuple[HttpServer, Flag, Flag]]:
    a, b = Flag(None), Flag(None)

    def failing() -> list[tuple[str, str]]:
        return [(name, f.value) for name, f in (("install", a), ("pods", b)) if f.value]

    # No request budget: the pipelined batches here test the reading (tests/serving/test_budget).
    srv = HttpServer(
        port=0, host="127.0.0.1", readiness=failing, loops=Liveness().failing, rates=None
    )
    srv.start()
    try:
        yield srv, a, b
    finally:
        srv.stop()
        srv.stop()  # idempotent


def test_ready_only_when_no_check_fails(server: tuple[HttpServer, Flag, Flag]) -> None:
    srv, a, b = server
    assert http_get(srv.bound_port, "/readyz") == (200, "ready\n")
    b.value = "no cache"
    assert http_get(srv.bound_port, "/readyz") == (503, "not ready: pods\npods: no cache\n")
    a.value = "entry missing"
    assert http_get(srv.bound_port, "/readyz") == (
        503,
        "not ready: install, pods\ninstall: entry missing\npods: no cache\n",
    )
    assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
    assert http_get(srv.bound_port, "/nope")[0] == 404


def test_metrics_has_istio_names(server: tuple[HttpServer, Flag, Flag]) -> None:
    srv, _, _ = server
    metrics.INSTALLS.labels(result="success").inc()
    code, body = http_get(srv.bound_port, "/metrics")
    assert code == 200
    for name in (
        "istio_cni_install_ready",
        'istio_cni_installs_total{result="success"}',
        "istio_cni_install_heals_total",
        "istio_cni_install_conflicts_total",
    ):
        assert name in body


def test_raising_check_is_not_ready() -> None:
    srv = HttpServer(port=0, host="127.0.0.1", readiness=_broken)
    srv.start()
    try:
        assert http_get(srv.bound_port, "/readyz") == (
            503,
            "not ready: readiness\nreadiness: raised RuntimeError: boom\n",
        )
    finally:
        srv.stop()


def test_default_listens_on_every_address() -> None:
    srv = HttpServer(port=0)
    srv.start()
    try:
        assert http_get(srv.bound_port, "/healthz")[0] == 200  # reached over IPv4 loopback
    finally:
        srv.stop()


def failures_of(loop: str) -> float:
    return REGISTRY.get_sample_value("istio_cni_loop_failures_total", {"loop": loop}) or 0.0


def test_a_loop_that_raises_fails_healthz_naming_it_and_is_counted() -> None:
    liveness = Liveness()
    srv = HttpServer(port=0, host="127.0.0.1", loops=liveness.failing)
    srv.start()
    before = failures_of("broken-loop")

    def body() -> None:
        raise RuntimeError("the watch broke")

    loop = BackgroundLoop("broken-loop", body, liveness=liveness)
    try:
        assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
        loop.start()
        wait_for(lambda: liveness.failing(), "the loop's end to be recorded", 5)
        assert http_get(srv.bound_port, "/healthz") == (
            503,
            "not live: broken-loop\nbroken-loop: raised RuntimeError: the watch broke\n",
        )
        assert failures_of("broken-loop") == before + 1
        metrics_page = http_get(srv.bound_port, "/metrics")[1]
        assert 'istio_cni_loop_failures_total{loop="broken-loop"}' in metrics_page
    finally:
        loop.stop()
        srv.stop()


def test_healthz_names_ended_loops_and_failing_liveness_checks_together() -> None:
    loops = Liveness()
    loops.ended("pod-server", "raised OSError: gone")
    checks = [("cni-dirs", "the mounted conf dir was deleted on the node")]
    srv = HttpServer(port=0, host="127.0.0.1", liveness=lambda: checks, loops=loops.failing)
    srv.start()
    try:
        assert http_get(srv.bound_port, "/healthz") == (
            503,
            "not live: pod-server, cni-dirs\npod-server: raised OSError: gone\n"
            "cni-dirs: the mounted conf dir was deleted on the node\n",
        )
    finally:
        srv.stop()


def test_the_agents_loops_report_to_the_registry_healthz_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built with their defaults, as wiring builds them: a loop's end reaches /healthz."""
    monkeypatch.setattr(LIVENESS, "_ended", {})  # this process's registry, emptied for the test
    srv = HttpServer(port=0, host="127.0.0.1")
    srv.start()
    stopped = threading.Event()
    loop = BackgroundLoop("returns-early", lambda: stopped.wait(0))  # returns, not stopped
    try:
        loop.start()
        wait_for(lambda: LIVENESS.failing(), "the loop's end to be recorded", 5)
        code, text = http_get(srv.bound_port, "/healthz")
        assert code == 503
        assert text == "not live: returns-early\nreturns-early: returned without being stopped\n"
    finally:
        loop.stop()
        srv.stop()


def test_pipelined_probes_and_a_4400_digit_length_leave_the_port_serving(
    server: tuple[HttpServer, Flag, Flag],
) -> None:
    srv, _, _ = server
    address = ("127.0.0.1", srv.bound_port)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n" * 300)
        replies = read_responses(sock, 300)
        assert len(replies) == 300 and all(body(r) == b"ok\n" for r in replies)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nContent-Length: " + b"1" * 4400)
        sock.sendall(b"\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 400 ")
        assert closed(sock)
    assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")


class Gate:
    """A /metrics page build that waits until released; when each build began."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.building = threading.Event()
        self.began: list[float] = []

    def build(self) -> bytes:
        self.began.append(time.monotonic())
        self.building.set()
        assert self.release.wait(10)
        return b"# a page\n"


def test_a_metrics_build_never_holds_the_probes() -> None:
    gate = Gate()
    srv = HttpServer(
        port=0, host="127.0.0.1", loops=Liveness().failing, metrics=MetricsPage(gate.build)
    )
    srv.start()
    scrape = socket.create_connection(("127.0.0.1", srv.bound_port), timeout=10)
    try:
        scrape.sendall(b"GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
        assert gate.building.wait(5)
        for _ in range(20):  # while the page is being built
            assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
            assert http_get(srv.bound_port, "/readyz") == (200, "ready\n")
        gate.release.set()
        assert body(read_response(scrape)) == b"# a page\n"
    finally:
        gate.release.set()
        scrape.close()
        srv.stop()


def test_a_metrics_flood_builds_the_page_at_most_once_per_period() -> None:
    gate = Gate()
    gate.release.set()
    period = 0.2
    srv = HttpServer(
        port=0,
        host="127.0.0.1",
        loops=Liveness().failing,
        metrics=MetricsPage(gate.build, period=period),
        rates=None,  # the page's rate under a flood, not the port's budget
    )
    srv.start()
    answered = [0] * 8

    def flood(n: int) -> None:
        with socket.create_connection(("127.0.0.1", srv.bound_port), timeout=10) as sock:
            for _ in range(3):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n" * 40)
                answered[n] += len(read_responses(sock, 40))

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(8)]
    probes = 0
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            assert http_get(srv.bound_port, "/healthz") == (200, "ok\n")
            probes += 1
        for t in threads:
            t.join()
    finally:
        srv.stop()
    assert answered == [120] * 8 and probes > 0
    # 960 scrapes: those that had come when a build began share its page (at most one build
    # per batch of 40), and no build begins within the period of the one before.
    assert len(gate.began) <= 3 * 8, len(gate.began)
    gaps = [b - a for a, b in itertools.pairwise(gate.began)]
    assert all(gap >= period - 0.01 for gap in gaps), gaps


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_metrics_page_is_never_older_than_the_request_and_built_once_per_period() -> None:
    clock = Clock()
    pages = iter(f"page {n}\n".encode() for n in range(10))
    page = MetricsPage(lambda: next(pages), period=1.0, clock=clock, sleep=clock.sleep)
    assert page.get() == b"page 0\n"  # the first: built at once
    clock.now += 0.25
    assert page.get() == b"page 1\n"  # came after that build began: waits out the period
    assert clock.slept == [0.75]
    clock.now += 5
    assert page.get() == b"page 2\n" and clock.slept == [0.75]  # past the period: no wait
    assert page.builds == 3
    assert page.get(asked=clock.now - 0.1) == b"page 2\n"  # came before the last build began
    assert page.builds == 3
