"""Helpers for the pod server tests: request bodies, pods, an HTTP client over the Unix socket,
and the stand-ins the handlers take.

`InMemoryPods` stands in for the pod cache (the cache itself is tested against the real API
server in test_cache.py); `ScriptedRedirector` stands in for the rule backends where a test is
about the handler's outcome for a given decision or failure, not about the rules.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from agent.config import Settings
from agent.podserver.handlers import Decision, PodHandlers
from agent.podserver.metrics import PluginMetrics
from agent.podserver.sandboxes import SandboxStore
from agent.rules.sidecar import pod as rules_pod
from plugin import wire


def cni_body(
    command: str = "ADD",
    *,
    container_id: str = "c0ffee",
    netns: str = "/var/run/netns/cni-test",
    ifname: str = "eth0",
    pod: str = "web-0",
    namespace: str = "app",
    uid: str = "",
) -> bytes:
    return wire.encode(
        wire.cni_request(
            command=command,
            container_id=container_id,
            netns=netns,
            ifname=ifname,
            pod_name=pod,
            pod_namespace=namespace,
            pod_uid=uid,
            cni_version="1.0.0",
            prev_result=None,
        )
    )


def make_pod(
    name: str = "web-0",
    namespace: str = "app",
    *,
    uid: str = "uid-1",
    sidecar: bool = True,
    annotations: Mapping[str, str] | None = None,
    node: str = "node-1",
) -> dict[str, Any]:
    """A pod as the API returns it; with `sidecar`, injected the way istioctl/the webhook does."""
    containers: list[dict[str, Any]] = [{"name": "app", "image": "app:1"}]
    notes = dict(annotations or {})
    if sidecar:
        containers.append({"name": "istio-proxy", "image": "proxyv2:1"})
        notes.setdefault("sidecar.istio.io/status", '{"containers":["istio-proxy"]}')
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": notes},
        "spec": {"nodeName": node, "containers": containers},
    }


class InMemoryPods:
    """PodSource stand-in: pods from a dict; `error` makes every lookup fail like the API."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.error: Exception | None = None
        self.lookups: list[tuple[str, str, str | None]] = []

    def get_pod(self, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
        self.lookups.append((namespace, name, uid))
        if self.error is not None:
            raise self.error
        pod = self.pods.get((namespace, name))
        if pod is not None and uid and pod["metadata"]["uid"] != uid:
            return None
        return pod


@dataclass(frozen=True)
class StandInDecision:
    redirect: bool
    reason: str


@dataclass
class ScriptedRedirector:
    """Redirector stand-in: decides by pod name (default: redirect), records applies, and fails
    or reports missing rules when told to."""

    decisions: dict[str, StandInDecision] = field(default_factory=dict)
    apply_error: Exception | None = None
    decide_error: Exception | None = None
    rules_in_place: bool = True
    applied: list[tuple[str, str]] = field(default_factory=list)

    def decide(self, pod: Mapping[str, Any]) -> Decision:
        if self.decide_error is not None:
            raise self.decide_error
        name = pod["metadata"]["name"]
        return self.decisions.get(name, StandInDecision(True, "sidecar istio-proxy present"))

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        if self.apply_error is not None:
            raise self.apply_error
        self.applied.append((netns, pod["metadata"]["name"]))
        return "iptables-nft"

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        return self.rules_in_place


@dataclass
class HandlerRig:
    pods: InMemoryPods
    redirector: Any
    sandboxes: SandboxStore
    registry: CollectorRegistry
    handlers: PodHandlers
    not_ready: list[str]

    def count(self, command: str, result: str) -> float:
        value = self.registry.get_sample_value(
            "istio_cni_plugin_requests_total", {"command": command, "result": result}
        )
        return value or 0.0


def build_rig(pods: InMemoryPods, redirector: Any) -> HandlerRig:
    registry = CollectorRegistry()
    sandboxes = SandboxStore()
    not_ready: list[str] = []
    handlers = PodHandlers(
        pods=pods,
        redirector=redirector,
        sandboxes=sandboxes,
        readiness=lambda: not_ready[0] if not_ready else None,
        metrics=PluginMetrics(registry),
    )
    return HandlerRig(pods, redirector, sandboxes, registry, handlers, not_ready)


def fields_of(
    records: list[logging.LogRecord], predicate: Callable[[logging.LogRecord], bool]
) -> list[dict[str, Any]]:
    return [dict(getattr(r, "fields", {})) for r in records if predicate(r)]


@dataclass
class RealDecisions(ScriptedRedirector):
    """The real decide() with the default settings' excluded namespaces; apply is recorded."""

    exclude: tuple[str, ...] = Settings().excludeNamespaces

    def decide(self, pod: Mapping[str, Any]) -> Decision:
        return rules_pod.decide(pod, exclude_namespaces=self.exclude)


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over AF_UNIX: the stdlib client, pointed at a socket path."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        super().__init__("istio-cni-agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)  # non-blocking connect, as the plugin does
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def call(path: str, method: str, url: str, body: bytes | None = None) -> tuple[int, Any]:
    conn = UnixHTTPConnection(path)
    try:
        conn.request(
            method,
            url,
            body=body,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


class ObservedCore:
    """The real CoreV1Api with a count of the list calls the cache made: watches opened (the call
    returned with the stream open), lists done, and calls that raised. Every call goes to the real
    client; the counts let a test wait for a state of the cache instead of sleeping."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self._lock = threading.Lock()
        self.watches = 0
        self.lists = 0
        self.failures = 0
        self.watch_timeouts: list[int] = []
        """The server-side timeoutSeconds of each watch opened."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def list_pod_for_all_namespaces(self, **options: Any) -> Any:
        try:
            response = self._core.list_pod_for_all_namespaces(**options)
        except Exception:
            with self._lock:
                self.failures += 1
            raise
        with self._lock:
            if options.get("watch"):
                self.watches += 1
                self.watch_timeouts.append(int(options["timeout_seconds"]))
            else:
                self.lists += 1
        return response
