"""The status socket (`istio-cni-agent status`), served by the agent's own StatusServer in a
private temporary dir over two stand-in pods; the request (path and all) comes from the fuzzer.
Contract: bench/doors/http_peer.py (well-formed replies, no 500, still serving)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from agent.pods.states import PodStates
from agent.rules.sidecar import pod as sidecar_pod
from agent.status.report import StatusReport
from agent.status.server import StatusServer
from bench.doors import http_peer
from bench.doors.pod_socket import PODS

SEEDS = [
    b"\0" + seed
    for seed in [
        b"GET /v1/pods HTTP/1.1\r\n\r\n",
        b"GET /v1/pods/app/web-0 HTTP/1.1\r\n\r\nGET /v1/pods/app/plain HTTP/1.1\r\n\r\n",
        b"GET /v1/pods/app/../x HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /v1/pods HTTP/1.1\r\nContent-Length: " + b"5" * 4400 + b"\r\n\r\n",
    ]
]
_path = ""
_server: StatusServer | None = None
DICTIONARY = http_peer.DICTIONARY


class _Lister:
    def list_pods(self) -> list[Any]:
        return list(PODS.values())

    def ready(self) -> bool:
        return True


def _decide(pod: Mapping[str, Any]) -> tuple[bool, str]:
    decision = sidecar_pod.decide(pod, exclude_namespaces=("kube-system",))
    return decision.redirect, decision.reason


def _no_netns(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, str]:
    return {}


def _connect() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    sock.connect(_path)
    return sock


def setup() -> None:
    global _path, _server
    _path = os.path.join(tempfile.mkdtemp(prefix="fuzz-status-"), "status.sock")
    report = StatusReport(
        node_name="node",
        pods=_Lister(),
        states=PodStates(),
        decide=_decide,
        find_netns=_no_netns,
        compare=lambda pod, netns, ambient: None,  # type: ignore[arg-type,return-value]
    )
    _server = StatusServer(_path, report)
    _server.start()


def teardown() -> None:
    global _server
    server, _server = _server, None
    if server is not None:
        server.stop()
    shutil.rmtree(os.path.dirname(_path), ignore_errors=True)


def one_input(data: bytes) -> None:
    http_peer.judge(http_peer.converse(_connect, http_peer.chunks_of(data)))
    http_peer.probe(_connect, b"GET /v1/pods HTTP/1.1\r\n\r\n", b"HTTP/1.1 200")
