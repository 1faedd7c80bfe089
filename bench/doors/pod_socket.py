"""The pod socket the plugin speaks to (ADD/CHECK/DEL/GC/LOG/STATUS), served by the agent's own
PodServer and PodHandlers in a private temporary dir, with the real sidecar decision over a
stand-in pod source (two pods) and a stand-in redirector that records instead of programming a
network namespace. Contract: bench/doors/http_peer.py (well-formed replies, no 500, still
serving); the socket is root-only, but the plugin's requests carry what a pod's owner chose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from agent.podserver.handlers import PodHandlers
from agent.podserver.metrics import PluginMetrics
from agent.podserver.sandboxes import SandboxStore
from agent.podserver.server import PodServer
from agent.rules.sidecar import pod as sidecar_pod
from bench.doors import http_peer
from plugin import wire

PODS = {
    ("app", "web-0"): {
        "metadata": {
            "name": "web-0",
            "namespace": "app",
            "uid": "uid-1",
            "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
        },
        "spec": {"nodeName": "node", "containers": [{"name": "istio-proxy"}]},
    },
    ("app", "plain"): {
        "metadata": {"name": "plain", "namespace": "app", "uid": "uid-2"},
        "spec": {"nodeName": "node", "containers": [{"name": "app"}]},
    },
}


def _request(command: str, pod: str) -> bytes:
    body = wire.encode(
        wire.cni_request(
            command=command,
            container_id="c0ffee",
            netns="/var/run/netns/fuzz-none",
            ifname="eth0",
            pod_name=pod,
            pod_namespace="app",
            pod_uid="",
            cni_version="1.0.0",
            prev_result=None,
        )
    )
    path = wire.COMMAND_PATHS[command].encode()
    head = b"POST %s HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (path, len(body))
    return head + body


SEEDS = [
    b"\0" + seed
    for seed in [
        _request("ADD", "web-0"),
        _request("DEL", "plain") + _request("CHECK", "web-0"),
        b"GET " + wire.PATH_STATUS.encode() + b" HTTP/1.1\r\n\r\n",
        b"POST " + wire.PATH_LOG.encode() + b" HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        b"POST "
        + wire.PATH_GC.encode()
        + b' HTTP/1.1\r\nContent-Length: 22\r\n\r\n{"validAttachments":1}',
        _request("CHECK", "plain") * 60,
        b"POST /v1/cni/add HTTP/1.1\r\nContent-Length: " + b"7" * 4400 + b"\r\n\r\n",
    ]
]


class _Pods:
    def get_pod(self, namespace: str, name: str, uid: str | None = None) -> Any:
        return PODS.get((namespace, name))


class _Recorder:
    """Records instead of programming: no netns is ever touched by the fuzzer."""

    def __init__(self) -> None:
        self.applied = 0

    def decide(self, pod: Mapping[str, Any]) -> Any:
        return sidecar_pod.decide(pod, exclude_namespaces=("kube-system",))

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        self.applied += 1
        return "iptables-nft"

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        return True


DICTIONARY = http_peer.DICTIONARY


def _serve(path: str) -> PodServer:
    handlers = PodHandlers(
        pods=_Pods(),
        redirector=_Recorder(),
        sandboxes=SandboxStore(),
        readiness=lambda: None,
        metrics=PluginMetrics(CollectorRegistry()),
    )
    server = PodServer(path, handlers)
    server.start()
    return server


_DOOR = http_peer.UnixDoor(
    "fuzz-pod-socket-",
    "pod.sock",
    _serve,
    b"GET " + wire.PATH_STATUS.encode() + b" HTTP/1.1\r\n\r\n",
)
setup, teardown, one_input = _DOOR.setup, _DOOR.teardown, _DOOR.one_input
