"""The pod server on a real Unix socket, spoken to over HTTP/1.1 by stdlib clients and curl."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ServerError
from agent.podserver.server import PodServer
from agent.socket_keeper import KEEP_SECONDS
from plugin import framing, wire
from testbed.wait import wait_for
from tests.podserver.helpers import (
    HandlerRig,
    InMemoryPods,
    ScriptedRedirector,
    UnixHTTPConnection,
    build_rig,
    call,
    cni_body,
    make_pod,
)
from tests.serving.raw import body, read_responses


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    # sun_path is 108 bytes: pytest's tmp_path can be longer than that, so use a short dir.
    short = Path("/tmp") / f"podsrv-{os.getpid()}-{tmp_path.name[-12:]}"
    yield short / "run"
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def served(run_dir: Path) -> Iterator[tuple[PodServer, HandlerRig]]:
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    server = PodServer(str(run_dir / wire.SOCKET_NAME), rig.handlers)
    server.start()
    try:
        yield server, rig
    finally:
        server.stop()


def test_add_over_http(served: tuple[PodServer, HandlerRig]) -> None:
    server, rig = served
    status, body = call(server.socket_path, "POST", wire.PATH_ADD, cni_body())
    assert status == 200
    assert wire.parse_reply(wire.encode(body))["result"] == "redirected"
    assert rig.redirector.applied == [("/var/run/netns/cni-test", "web-0")]


def test_error_reply_carries_cni_code(served: tuple[PodServer, HandlerRig]) -> None:
    server, rig = served
    rig.pods.pods.clear()
    status, body = call(server.socket_path, "POST", wire.PATH_ADD, cni_body())
    assert status == 503
    error = wire.parse_error_reply(wire.encode(body), status)
    assert error["code"] == 11 and "app/web-0" in error["msg"]


def test_every_endpoint_answers(served: tuple[PodServer, HandlerRig]) -> None:
    server, _ = served
    path = server.socket_path
    assert call(path, "POST", wire.PATH_CHECK, cni_body("CHECK"))[0] == 200
    assert call(path, "POST", wire.PATH_DEL, cni_body("DEL", netns=""))[0] == 200
    assert call(path, "POST", wire.PATH_GC, wire.encode(wire.gc_request([])))[0] == 200
    assert call(path, "GET", wire.PATH_STATUS) == (200, {"ready": True})
    log_body = wire.encode(
        wire.log_request(
            level="info", msg="hello", pod_name="web-0", pod_namespace="app", container_id="c"
        )
    )
    assert call(path, "POST", wire.PATH_LOG, log_body)[0] == 200


@pytest.mark.parametrize(
    ("method", "url", "status"),
    [
        ("GET", "/v1/nope", 404),
        ("GET", wire.PATH_ADD, 405),
        ("POST", wire.PATH_STATUS, 405),
        ("DELETE", wire.PATH_DEL, 405),
    ],
    ids=["unknown-path", "get-add", "post-status", "delete-del"],
)
def test_wrong_path_or_method(
    served: tuple[PodServer, HandlerRig], method: str, url: str, status: int
) -> None:
    server, _ = served
    got, body = call(server.socket_path, method, url, b"{}" if method == "POST" else None)
    assert got == status
    assert body["code"] == 999 and url in body["msg"]


def test_body_over_limit_is_refused(served: tuple[PodServer, HandlerRig]) -> None:
    server, rig = served
    head = (
        f"POST {wire.PATH_ADD} HTTP/1.1\r\nHost: x\r\nContent-Length: {wire.MAX_BODY + 1}\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(server.socket_path)
        sock.sendall(head)  # the body is never sent: the server must not wait for it
        response = framing.read_http_response(sock.recv)
    assert response.status == 413
    assert wire.parse_error_reply(response.body, 413)["code"] == 6
    assert response.headers["connection"] == "close"
    assert rig.pods.lookups == []


def test_keep_alive_serves_several_requests(served: tuple[PodServer, HandlerRig]) -> None:
    server, _ = served
    conn = UnixHTTPConnection(server.socket_path)
    try:
        for n in range(3):
            conn.request("POST", wire.PATH_ADD, body=cni_body(container_id=f"k{n}"))
            response = conn.getresponse()
            assert response.status == 200
            response.read()
    finally:
        conn.close()


def test_plugin_framing_round_trip(served: tuple[PodServer, HandlerRig]) -> None:
    """The plugin's own HTTP framing (framing.http_request / read_http_response) against us."""
    server, _ = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(server.socket_path)
        sock.sendall(framing.http_request("POST", wire.PATH_ADD, cni_body()))
        response = framing.read_http_response(sock.recv)
    assert response.status == 200
    assert wire.parse_reply(response.body)["result"] == "redirected"


def test_curl_unix_socket(served: tuple[PodServer, HandlerRig]) -> None:
    curl = shutil.which("curl")
    assert curl, "curl is missing: install it with ci/setup-apt"
    server, _ = served
    out = subprocess.run(
        [
            curl,
            "-sS",
            "--fail-with-body",
            "--unix-socket",
            server.socket_path,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            cni_body().decode(),
            "http://localhost" + wire.PATH_ADD,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout)["result"] == "redirected"
    status = subprocess.run(
        [curl, "-sS", "--unix-socket", server.socket_path, "http://localhost/v1/status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(status.stdout) == {"ready": True}


def test_socket_mode_and_run_dir(served: tuple[PodServer, HandlerRig], run_dir: Path) -> None:
    server, _ = served
    mode = os.lstat(server.socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert os.listdir(run_dir) == [wire.SOCKET_NAME]  # no temp name left behind


def test_stale_socket_is_replaced(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    path = str(run_dir / wire.SOCKET_NAME)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # bound, never listening: what a crashed agent leaves
    stale.close()
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    server = PodServer(path, rig.handlers)
    server.start()
    try:
        assert call(path, "GET", wire.PATH_STATUS)[0] == 200
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    finally:
        server.stop()
    assert not os.path.lexists(path)  # stop removes our socket


def test_regular_file_in_the_way_is_kept(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    path = run_dir / wire.SOCKET_NAME
    path.write_text("not a socket")
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    with pytest.raises(ServerError, match=r"pluginevent\.sock: a regular file is in the way"):
        PodServer(str(path), rig.handlers).start()
    assert path.read_text() == "not a socket"
    assert os.listdir(run_dir) == [wire.SOCKET_NAME]


def test_stop_leaves_a_newer_socket_alone(run_dir: Path) -> None:
    path = str(run_dir / wire.SOCKET_NAME)
    old = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    new = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    old.start()
    try:
        new.start()  # a new agent takes the path over
        old.stop()
        assert call(path, "GET", wire.PATH_STATUS)[0] == 200
    finally:
        old.stop()
        new.stop()


def test_the_older_agent_takes_the_path_back_when_the_newer_leaves(run_dir: Path) -> None:
    """A rolling update's newer agent takes the socket over, then goes (rolled back), removing
    it: the older one binds the path again and the plugin is answered, instead of every ADD on
    the node failing until the older agent restarts."""
    path = str(run_dir / wire.SOCKET_NAME)
    old = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    new = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    old.start()
    try:
        new.start()
        assert not old.keep_socket()  # the newer serves the path: left alone
        new.stop()
        assert not os.path.lexists(path)
        assert old.keep_socket()
        assert call(path, "GET", wire.PATH_STATUS)[0] == 200
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert not old.keep_socket()  # ours again
    finally:
        new.stop()
        old.stop()
    assert not os.path.lexists(path)  # the socket bound again is removed on stop too


def test_a_deleted_socket_is_bound_again_by_the_keeper(run_dir: Path) -> None:
    """Nobody calls keep_socket: the server's own keeper puts the path back."""
    path = str(run_dir / wire.SOCKET_NAME)
    server = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    server.start()
    try:
        os.unlink(path)
        assert wait_for(lambda: os.path.lexists(path), timeout=3 * KEEP_SECONDS)
        assert call(path, "GET", wire.PATH_STATUS)[0] == 200
    finally:
        server.stop()


def test_stop_ends_idle_keep_alive_connections(run_dir: Path) -> None:
    path = str(run_dir / wire.SOCKET_NAME)
    server = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    server.start()
    conn = UnixHTTPConnection(path)
    try:
        conn.request("GET", wire.PATH_STATUS)
        conn.getresponse().read()  # the connection now idles in the server's thread
        server.stop()  # returns only after that thread ended
        assert not server.listening()
    finally:
        conn.close()
        server.stop()


class GatedRedirector(ScriptedRedirector):
    """Holds every apply until `release` is set, counting how many ran at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inflight = 0
        self.peak = 0

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        with self.lock:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
        self.release.wait(30)
        with self.lock:
            self.inflight -= 1
        return super().apply(netns, pod)


def test_110_concurrent_adds_all_answered(run_dir: Path) -> None:
    redirector = GatedRedirector()
    rig = build_rig(InMemoryPods(make_pod()), redirector)
    path = str(run_dir / wire.SOCKET_NAME)
    server = PodServer(path, rig.handlers)
    server.start()
    try:
        with ThreadPoolExecutor(max_workers=110) as pool:
            futures = [
                pool.submit(
                    call, path, "POST", wire.PATH_ADD, cni_body(container_id=f"sandbox-{n}")
                )
                for n in range(110)
            ]
            # Let every request reach the redirector before any finishes (or 20 s pass).
            for _ in range(200):
                with redirector.lock:
                    if redirector.inflight == 110:
                        break
                threading.Event().wait(0.1)
            redirector.release.set()
            results = [f.result(timeout=60) for f in futures]
    finally:
        redirector.release.set()
        server.stop()
    assert [status for status, _ in results] == [200] * 110
    assert {body["result"] for _, body in results} == {"redirected"}
    assert len(rig.sandboxes) == 110
    assert redirector.peak == 110  # served side by side, not one after another


def test_a_4400_digit_length_is_refused_and_the_socket_goes_on(
    served: tuple[PodServer, HandlerRig],
) -> None:
    server, rig = served
    head = f"POST {wire.PATH_ADD} HTTP/1.1\r\nHost: x\r\nContent-Length: {'7' * 4400}\r\n\r\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(server.socket_path)
        sock.sendall(head.encode())
        response = framing.read_http_response(sock.recv)
    assert response.status == 400
    assert wire.parse_error_reply(response.body, 400)["code"] == 6
    assert rig.pods.lookups == []
    assert call(server.socket_path, "POST", wire.PATH_ADD, cni_body())[0] == 200


def test_pipelined_requests_are_answered_in_order(served: tuple[PodServer, HandlerRig]) -> None:
    server, _ = served
    request = f"GET {wire.PATH_STATUS} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(server.socket_path)
        sock.sendall(request * 300)
        replies = read_responses(sock, 300)
    assert len(replies) == 300
    assert all(json.loads(body(r)) == {"ready": True} for r in replies)
    assert call(server.socket_path, "POST", wire.PATH_ADD, cni_body())[0] == 200
