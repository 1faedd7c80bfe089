"""The soak's check that a sidecar pod ran captured from its first instant, through its proxy
(bench/soak/sidecar.py): the app's own `connect` lines (ci/image/app.py) against a real echo
server on loopback, directly and through a forwarder standing where Envoy stands."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.soak.sidecar import FIRST_CONNECT_S, RECHECK_S, SidecarCheck, answer, verdict

APP = Path(__file__).resolve().parents[2] / "ci" / "image" / "app.py"
POD = "10.0.0.7"
THROUGH = (
    f"10:00:01 connect 10.0.0.5:8080 app port=8080 peer={POD}:40001 echo=hello from={POD}:51234"
)
ESCAPED = (
    f"10:00:02 connect 10.0.0.5:8080 app port=8080 peer={POD}:51240 echo=hello from={POD}:51240"
)
REFUSED = "10:00:00 connect 10.0.0.5:8080 error: [Errno 111] Connection refused"


def never() -> bool:
    raise AssertionError("the rules were asked although an answer decided")


def test_an_answer_names_what_the_server_saw_and_the_apps_own_end() -> None:
    assert answer(THROUGH) == (f"{POD}:40001", f"{POD}:51234")
    assert answer(REFUSED) is None
    assert answer("10:00:03 connect 10.0.0.5:8080 error: timed out") is None


def test_an_answer_through_the_proxy_proves_the_pod_captured() -> None:
    assert verdict([REFUSED, THROUGH], pod_ip=POD, rules=never, waited=0.5) is True


def test_one_answer_from_the_apps_own_socket_is_uncaptured_whatever_else() -> None:
    assert verdict([THROUGH, ESCAPED], pod_ip=POD, rules=never, waited=0.5) is False
    assert verdict([ESCAPED], pod_ip=POD, rules=lambda: True, waited=60.0) is False


def test_no_answer_waits_then_the_rules_decide() -> None:
    assert verdict([REFUSED], pod_ip=POD, rules=never, waited=FIRST_CONNECT_S - 1) is None
    assert verdict([REFUSED], pod_ip=POD, rules=lambda: True, waited=FIRST_CONNECT_S) is True
    assert verdict([], pod_ip=POD, rules=lambda: False, waited=FIRST_CONNECT_S) is False


def test_an_answer_through_a_nat_proves_nothing() -> None:
    natted = THROUGH.replace(f"peer={POD}:", "peer=10.0.0.1:")
    assert verdict([natted], pod_ip=POD, rules=never, waited=1.0) is None
    assert verdict([natted], pod_ip=POD, rules=lambda: False, waited=FIRST_CONNECT_S) is False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    port = free_port()
    command = [sys.executable, str(APP), "serve", str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            assert "app listening" in server.stdout.readline()
            yield port
        finally:
            server.terminate()


@contextlib.contextmanager
def forwarder(target: int) -> Iterator[int]:
    """Stands where Envoy stands: takes the app's connection, opens its own to the server."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def pipe(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(4096):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                down, _ = listener.accept()
            except TimeoutError:
                continue
            with down, socket.create_connection(("127.0.0.1", target)) as up:
                back = threading.Thread(target=pipe, args=(up, down), daemon=True)
                back.start()
                pipe(down, up)
                back.join(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def app_connect(port: int) -> str:
    done = subprocess.run(
        [sys.executable, str(APP), "connect", "127.0.0.1", str(port)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_the_real_app_tells_a_direct_connection_from_one_through_a_proxy() -> None:
    with echo_server() as port:
        direct = app_connect(port)
        with forwarder(port) as front:
            proxied = app_connect(front)
    assert verdict([direct], pod_ip="127.0.0.1", rules=never, waited=0.0) is False, direct
    assert verdict([proxied], pod_ip="127.0.0.1", rules=never, waited=0.0) is True, proxied


class FakeCore:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.reads = 0

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str) -> str:
        assert (namespace, container) == ("soak", "app"), (namespace, container)
        self.reads += 1
        return "\n".join(self.log)


def running(uid: str) -> Any:
    return types.SimpleNamespace(
        metadata=types.SimpleNamespace(name=f"churn-{uid}", uid=uid),
        status=types.SimpleNamespace(pod_ip=POD),
    )


def test_the_check_reads_each_pod_at_most_once_a_recheck_and_counts_proxy_proofs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    core = FakeCore([REFUSED])
    netns_asked: list[str] = []

    def netns(uid: str) -> str:
        netns_asked.append(uid)
        return f"/run/netns/{uid}"

    monkeypatch.setattr("testbed.podnet.has_istio_rules", lambda path: path == "/run/netns/b")
    check = SidecarCheck(core, "soak", netns, clock=lambda: now[0])
    assert check(running("a")) is None and core.reads == 1
    assert check(running("a")) is None and core.reads == 1  # within RECHECK_S: not read
    now[0] += RECHECK_S
    core.log.append(THROUGH)
    assert check(running("a")) is True and core.reads == 2 and netns_asked == []
    core.log[:] = [REFUSED]
    assert check(running("b")) is None
    now[0] += FIRST_CONNECT_S
    assert check(running("b")) is True and netns_asked == ["b"]  # no answer: its rules
    assert check.through_proxy == 1
