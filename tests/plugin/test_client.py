"""The agent client against the test double: limits, time limits, malformed answers."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from plugin import framing, wire
from plugin.client import AgentClient, AgentUnavailable
from plugin.errors import CniError
from tests.plugin.helpers import AgentTestDouble, Answer

ADD = wire.cni_request(
    command="ADD",
    container_id="c",
    netns="/n",
    ifname="eth0",
    pod_name="p",
    pod_namespace="ns",
    pod_uid="u",
    cni_version="1.1.0",
    prev_result=None,
)


def test_socket_path_comes_from_run_dir(agent: AgentTestDouble) -> None:
    client = AgentClient(str(agent.run_dir) + "/", timeout=5)
    assert client.path == str(agent.run_dir / "pluginevent.sock")
    assert client.cni("ADD", ADD) == {"result": "redirected", "reason": "sidecar"}


@pytest.mark.parametrize("status", [200, 500], ids=["ok", "error"])
def test_body_over_one_mib_is_cut(status: int, agent: AgentTestDouble) -> None:
    huge = b'{"code": 104, "msg": "' + b"x" * (3 << 20) + b'"}'
    agent.answers["/v1/cni/add"] = Answer(status, huge)
    with pytest.raises(CniError) as caught:
        AgentClient(str(agent.run_dir), timeout=5).cni("ADD", ADD)
    assert caught.value.code == wire.INTERNAL
    assert len(caught.value.msg) + len(caught.value.details) < 4096


def test_read_stops_at_the_limit() -> None:
    chunks = [b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n"] + [b"y" * 65536] * 100
    calls = []

    def recv(n: int) -> bytes:
        calls.append(n)
        return chunks.pop(0) if chunks else b""

    response = framing.read_http_response(recv, limit=wire.MAX_BODY)
    assert response.truncated and len(response.body) == wire.MAX_BODY
    assert len(calls) <= wire.MAX_BODY // 65536 + 2  # never read the rest


def test_total_timeout_covers_a_slow_body(tmp_path: Path) -> None:
    """An agent that trickles bytes forever still hits the total deadline."""
    path = tmp_path / "pluginevent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        while not stop.wait(0.05):
            try:
                conn.sendall(b" ")
            except OSError:
                break
        conn.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with pytest.raises(AgentUnavailable) as caught:
            AgentClient(str(tmp_path), timeout=0.4).cni("ADD", ADD)
        assert caught.value.code == wire.TRY_AGAIN_LATER
    finally:
        stop.set()
        server.close()
        thread.join(timeout=5)


def test_not_http_is_internal_error(tmp_path: Path) -> None:
    path = tmp_path / "pluginevent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()

    def garbage() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=garbage, daemon=True)
    thread.start()
    try:
        with pytest.raises(CniError) as caught:
            AgentClient(str(tmp_path), timeout=2).cni("ADD", ADD)
        assert caught.value.code == wire.INTERNAL and "malformed" in caught.value.msg
    finally:
        server.close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    "body", [b"", b"[]", b'{"result": "maybe"}'], ids=["empty", "array", "bad-result"]
)
def test_invalid_ok_reply_is_internal_error(body: bytes, agent: AgentTestDouble) -> None:
    agent.answers["/v1/cni/add"] = Answer(200, body)
    with pytest.raises(CniError) as caught:
        AgentClient(str(agent.run_dir), timeout=2).cni("ADD", ADD)
    assert caught.value.code == wire.INTERNAL


def test_log_is_best_effort(tmp_path: Path, agent: AgentTestDouble) -> None:
    line = wire.log_request(
        level="info", msg="m", pod_name="p", pod_namespace="ns", container_id="c"
    )
    assert AgentClient(str(agent.run_dir), timeout=2).log(line) is True
    assert AgentClient(str(tmp_path), timeout=2).log(line) is False
