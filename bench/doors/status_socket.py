"""The status socket (`istio-cni-agent status`), served by the agent's own StatusServer in a
private temporary dir over two stand-in pods; the request (path and all) comes from the fuzzer.
Contract: bench/doors/http_peer.py (well-formed replies, no 500, still serving)."""

from __future__ import annotations

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


def _serve(path: str) -> StatusServer:
    report = StatusReport(
        node_name="node",
        pods=_Lister(),
        states=PodStates(),
        decide=_decide,
        find_netns=_no_netns,
        compare=lambda pod, netns, ambient: None,  # type: ignore[arg-type,return-value]
    )
    server = StatusServer(path, report)
    server.start()
    return server


_DOOR = http_peer.UnixDoor("fuzz-status-", "status.sock", _serve, b"GET /v1/pods HTTP/1.1\r\n\r\n")
setup, teardown, one_input = _DOOR.setup, _DOOR.teardown, _DOOR.one_input
