"""The checks of the agent's own parts: the plugin's socket answering HTTP (a real pod server on
a real Unix socket), the API server by a real client (unreachable here), install and ambient."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kube import build_clients
from agent.podserver.server import PodServer
from agent.readiness import checks
from plugin import wire
from testbed.agent_host import unreachable_kubeconfig
from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, make_pod


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    short = Path("/tmp") / f"rdy-{os.getpid()}-{tmp_path.name[-12:]}"  # sun_path: 108 bytes
    yield short
    shutil.rmtree(short, ignore_errors=True)


def test_socket_check_passes_while_the_pod_server_serves(run_dir: Path) -> None:
    path = str(run_dir / wire.SOCKET_NAME)
    check = checks.socket_check(path)
    assert check() == f"the plugin's socket {path} does not answer: No such file or directory"
    server = PodServer(path, build_rig(InMemoryPods(make_pod()), ScriptedRedirector()).handlers)
    server.start()
    try:
        assert check() is None
    finally:
        server.stop()
    assert "does not answer" in str(check())


def test_socket_check_fails_on_a_socket_nobody_serves(run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    path = str(run_dir / wire.SOCKET_NAME)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(path)  # bound, not listening: what a dead agent's file looks like
        assert "does not answer: Connection refused" in str(checks.socket_check(path)())


def test_api_check_passes_on_a_synced_cache_else_asks_the_api_server() -> None:
    clients = build_clients({"KUBECONFIG": unreachable_kubeconfig()})
    try:
        assert checks.api_check(lambda: True, clients.core, "node-1")() is None
        reason = checks.api_check(lambda: False, clients.core, "node-1")()
    finally:
        clients.close()
    assert reason is not None
    assert reason.startswith("the pod cache has not listed this node's pods and the API server")


def test_install_check_names_what_is_missing() -> None:
    missing = ["/host/etc/cni/net.d/10-net.conflist: our entry is missing or not as written"]
    assert checks.install_check(lambda: True, lambda: missing)() is None
    assert checks.install_check(lambda: False, lambda: missing)() == missing[0]
    assert "being installed" in str(checks.install_check(lambda: False, list)())


def test_ambient_check_names_the_zds_socket() -> None:
    check = checks.ambient_check(lambda: False, "/var/run/ztunnel/ztunnel.sock")
    assert "/var/run/ztunnel/ztunnel.sock" in str(check())
    assert checks.ambient_check(lambda: True, "/x")() is None
