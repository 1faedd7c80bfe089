"""The HTTP port's request budget (agent.serving.budget): a port-wide and a per-peer rate, 429 and
a closed connection past them, and kubelet's probes, from an address of their own, answered
whatever other peers send."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from agent.http_server import HttpServer
from agent.liveness import Liveness
from agent.serving.budget import HTTP, Budget, Rates
from tests.serving.raw import closed, probe, read_responses

RATES = Rates(
    rate=100.0,
    burst=20.0,
    peer_rate=10.0,
    peer_burst=5.0,
    probe_rate=1.0,
    probe_burst=2.0,
    probe_paths=frozenset({"/healthz"}),
    max_peers=16,
)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def answered(budget: Budget, peer: str, path: str, n: int) -> int:
    return sum(budget.request(peer, path) for _ in range(n))


def test_a_peer_gets_its_burst_then_its_rate() -> None:
    clock = Clock()
    budget = Budget(RATES, clock=clock)
    assert answered(budget, "10.0.0.5", "/metrics", 5) == 5
    assert budget.connection("10.0.0.5")  # a probe could still be answered
    assert answered(budget, "10.0.0.5", "/healthz", 10) == 2  # its probe allowance
    assert not budget.connection("10.0.0.5")  # nothing left: closed before it is read
    clock.now += 0.5  # 10 a second
    assert budget.connection("10.0.0.5")
    assert answered(budget, "10.0.0.5", "/metrics", 10) == 5
    assert answered(budget, "10.0.0.6", "/metrics", 10) == 5  # another peer: its own


def test_the_port_as_a_whole_has_a_rate() -> None:
    clock = Clock()
    budget = Budget(RATES, clock=clock)
    peers = [f"10.0.1.{i}" for i in range(3)]
    assert sum(answered(budget, p, "/metrics", 5) for p in peers) == 15
    clock.now += 1.0  # each peer is full again, the port has 20 (its burst)
    many = [f"10.0.2.{i}" for i in range(10)]
    assert sum(answered(budget, p, "/metrics", 5) for p in many) == 20


def test_probes_past_the_budget_come_from_each_peers_own_allowance() -> None:
    clock = Clock()
    budget = Budget(RATES, clock=clock)
    flooders = [f"10.0.3.{i}" for i in range(4)]
    for peer in flooders:  # the port's budget and their own spent, probes included
        answered(budget, peer, "/healthz", 50)
    assert answered(budget, "10.0.3.0", "/metrics", 1) == 0
    assert answered(budget, "10.0.3.0", "/healthz", 1) == 0
    kubelet = "192.168.0.7"
    assert answered(budget, kubelet, "/healthz", 2) == 2  # its probes are answered
    assert answered(budget, kubelet, "/metrics", 1) == 0  # the port's budget is spent
    clock.now += 1.0
    assert answered(budget, kubelet, "/healthz", 1) == 1


def test_refused_requests_spend_the_peers_allowance_then_its_connections_are_closed() -> None:
    clock = Clock()
    budget = Budget(RATES, clock=clock)
    assert answered(budget, "10.0.5.1", "/metrics", 5) == 5
    assert budget.connection("10.0.5.1")
    assert answered(budget, "10.0.5.1", "/metrics", 2) == 0  # each refusal spends a probe token
    assert not budget.connection("10.0.5.1")  # closed as accepted from now on
    assert budget.connection("10.0.5.2")


def test_the_peer_table_is_bounded() -> None:
    budget = Budget(dataclasses.replace(RATES, max_peers=3), clock=Clock())
    for i in range(100):
        budget.request(f"10.0.4.{i}", "/metrics")
    assert len(budget._peers) == 3


@pytest.fixture
def port() -> Iterator[int]:
    srv = HttpServer(port=0, host="127.0.0.1", loops=Liveness().failing)
    srv.start()
    try:
        yield srv.bound_port
    finally:
        srv.stop()


def connect(port: int, source: str, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=timeout, source_address=(source, 0)
    )


def test_a_pipelined_flood_is_cut_at_its_budget_with_a_429(port: int) -> None:
    with connect(port, "127.0.0.2") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n" * 1000)
        replies = read_responses(sock, 1000)
        assert closed(sock)
    statuses = [r.split(b"\r\n", 1)[0] for r in replies]
    budgeted = int(HTTP.peer_burst + HTTP.probe_burst)
    assert len(statuses) <= budgeted + 5, len(statuses)  # + what refilled meanwhile
    assert statuses[-1] == b"HTTP/1.1 429 Too Many Requests"
    assert set(statuses[:-1]) == {b"HTTP/1.1 200 OK"}


def test_kubelets_probes_are_answered_during_a_flood_from_pods(port: int) -> None:
    """Four pods flood /healthz (pipelined, again and again); the node's own address probes."""
    stop = threading.Event()
    ok = [0]

    def flood(source: str) -> None:
        while not stop.is_set():
            try:
                with connect(port, source, timeout=2.0) as sock:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n" * 200)
                    ok[0] += sum(r.startswith(b"HTTP/1.1 200 ") for r in read_responses(sock, 200))
            except OSError:
                pass  # closed before it was read: over budget

    pods = [threading.Thread(target=flood, args=(f"127.0.1.{i}",)) for i in range(1, 5)]
    began = time.monotonic()
    for t in pods:
        t.start()
    try:
        time.sleep(0.5)
        statuses = []
        for _ in range(10):
            statuses.append(probe(port, "127.0.0.1"))  # the node's own address
            time.sleep(0.2)
        assert statuses == [b"HTTP/1.1 200 OK"] * 10
    finally:
        stop.set()
        for t in pods:
            t.join()
    lasted = time.monotonic() - began
    most = HTTP.burst + HTTP.rate * lasted + 4 * (HTTP.probe_burst + HTTP.probe_rate * lasted)
    assert 0 < ok[0] <= most, (ok[0], most)  # the port's budget, and each pod's probes
