"""The plugin socket's mode: 0600 whatever the umask, reachable by root (the plugin, run by the
container runtime) only, and never accepting a connection before it has that mode."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import ServerError
from agent.podserver.server import PodServer
from plugin import wire
from tests.podserver.helpers import (
    InMemoryPods,
    ScriptedRedirector,
    build_rig,
    call,
    make_pod,
)

NOBODY = 65534


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    short = Path("/tmp") / f"sockmode-{os.getpid()}-{tmp_path.name[-12:]}"
    yield short / "run"
    shutil.rmtree(short, ignore_errors=True)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def serving(path: Path) -> Iterator[PodServer]:
    server = PodServer(
        str(path), build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect_errno_as(uid: int, path: str) -> int:
    """Connect to `path` from a child process running as `uid`; its errno (0: connected)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
        except OSError as e:
            code = e.errno or 255
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_mode_is_0600_whatever_the_umask(run_dir: Path) -> None:
    path = run_dir / wire.SOCKET_NAME
    with umask(0), serving(path):
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700  # created by us: 0700
        assert os.lstat(path).st_uid == os.getuid()


@pytest.mark.netns  # the root tier: it runs a client as another user
def test_only_root_can_connect(run_dir: Path) -> None:
    # The DaemonSet's hostPath volume creates the run dir 0755: the socket's mode alone guards.
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o755)
    path = run_dir / wire.SOCKET_NAME
    with umask(0), serving(path):
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o755  # the node's dir is left as is
        assert connect_errno_as(NOBODY, str(path)) == errno.EACCES
        assert connect_errno_as(0, str(path)) == 0
        assert call(str(path), "GET", wire.PATH_STATUS)[0] == 200


def test_no_connection_before_the_final_mode(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between bind and chmod the socket has the umask's mode: it must refuse connections. By
    the rename it is 0600 and listens, so the path never names a socket that refuses one."""
    refused: list[str] = []
    real_chmod, real_replace = os.chmod, os.replace

    def try_connect(where: str, target: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(target)
            except ConnectionRefusedError:
                refused.append(where)

    def chmod(target: str, mode: int, *, dir_fd: int | None = None) -> None:
        try_connect("before chmod", at(target, dir_fd))
        real_chmod(target, mode, dir_fd=dir_fd)

    def replace(src: str, dst: str, *, src_dir_fd: int | None = None) -> None:
        assert stat.S_IMODE(os.lstat(at(src, src_dir_fd)).st_mode) == 0o600, "0600 first"
        try_connect("before rename", at(src, src_dir_fd))
        real_replace(src, dst, src_dir_fd=src_dir_fd)

    monkeypatch.setattr(os, "chmod", chmod)  # the os module the server uses
    monkeypatch.setattr(os, "replace", replace)
    with umask(0), serving(run_dir / wire.SOCKET_NAME) as server:
        assert refused == ["before chmod"]
        assert call(server.socket_path, "GET", wire.PATH_STATUS)[0] == 200
        assert os.listdir(run_dir) == [wire.SOCKET_NAME]


def at(name: str, dir_fd: int | None) -> str:
    return name if dir_fd is None else f"/proc/self/fd/{dir_fd}/{name}"


def test_stale_socket_with_a_loose_mode_is_replaced_by_a_0600_one(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    path = run_dir / wire.SOCKET_NAME
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    os.chmod(path, 0o666)  # what Istio's agent leaves behind
    with serving(path):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_too_long_path_is_refused_by_name(tmp_path: Path) -> None:
    path = Path("/tmp") / ("x" * 96) / wire.SOCKET_NAME
    with pytest.raises(ServerError, match="too long for a Unix socket"):
        PodServer(
            str(path), build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers
        ).start()
    assert not path.parent.exists()


def status_as(uid: int, path: str) -> bytes:
    """GET /v1/status from a child process running as `uid`: the first bytes it got back."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        got = b""
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(path)
                s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
                got = s.recv(64)
        except (ConnectionResetError, BrokenPipeError):  # closed before or after the request
            got = b""
        except OSError as e:
            got = f"error {e.errno}".encode()
        os.write(write, got)
        os._exit(0)
    os.close(write)
    try:
        os.waitpid(pid, 0)
        return os.read(read, 64)
    finally:
        os.close(read)


@pytest.mark.netns  # the root tier: it runs a client as another user
def test_a_peer_other_than_root_is_refused_where_the_mode_would_let_it_in(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    os.chmod(run_dir, 0o755)  # the DaemonSet's hostPath
    path = run_dir / wire.SOCKET_NAME
    with serving(path):
        os.chmod(path, 0o666)  # a socket made reachable by mistake
        assert status_as(NOBODY, str(path)) == b""  # connected, then closed unanswered
        assert status_as(0, str(path)).startswith(b"HTTP/1.1 200 ")
