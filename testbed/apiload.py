"""Load the test bed's API server with a large cluster's objects, fast: namespaces and pods of
other nodes (objects only: no kubelet runs them), created by concurrent requests.

    load_cluster(plane, namespaces=2000, pods=20000) -> Loaded (what, and how long it took)

Each worker thread keeps one TLS connection (keep-alive) as the admin and POSTs JSON bodies;
the kubernetes client is not used (its models would cost more than the API server's work).
The admin is in `system:masters`, which API Priority and Fairness exempts: no throttling.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from testbed.controlplane import ControlPlane

WORKERS = 24
POD_NAMESPACES = 20
"""Namespaces that hold the pods (each needs its default ServiceAccount first); the others are
empty, as most of a large cluster's namespaces hold few pods."""
OTHER_NODES = 100
AMBIENT_LABEL = {"istio.io/dataplane-mode": "ambient"}
SIDECAR_STATUS = '{"containers":["istio-proxy"],"volumes":["istio-envoy"]}'


@dataclass(frozen=True)
class Loaded:
    namespaces: int
    pods: int
    namespaces_seconds: float
    pods_seconds: float

    def __str__(self) -> str:
        return (
            f"{self.namespaces} namespaces in {self.namespaces_seconds:.1f} s, "
            f"{self.pods} pods in {self.pods_seconds:.1f} s"
        )


def namespace_name(i: int) -> str:
    return f"load-{i:05d}"


def namespace_body(i: int) -> dict[str, Any]:
    labels = {"team": f"team-{i % 37}", "env": ("prod", "dev", "test")[i % 3]}
    if i % 4 == 0:
        labels.update(AMBIENT_LABEL)
    meta = {"name": namespace_name(i), "labels": labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def pod_body(i: int) -> dict[str, Any]:
    """A pod of another node, about the size of a Deployment's pod with an injected sidecar."""
    app = f"app-{i % 500}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{i:06d}",
            "labels": {"app": app, "pod-template-hash": f"{i % 997:08x}"},
            "annotations": {
                "sidecar.istio.io/status": SIDECAR_STATUS,
                "prometheus.io/port": "15020",
            },
        },
        "spec": {
            "nodeName": f"other-node-{i % OTHER_NODES:03d}",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "ports": [{"containerPort": 8080}],
                },
                {
                    "name": "istio-proxy",
                    "image": "registry.invalid/proxyv2:1",
                    "args": ["proxy", "sidecar"],
                    "env": [{"name": "ISTIO_META_POD_NAME", "value": app}],
                    "securityContext": {"runAsUser": 1337, "runAsGroup": 1337},
                },
            ],
        },
    }


def create_all(plane: ControlPlane, requests: list[tuple[str, dict[str, Any]]]) -> float:
    """POST every (path, body), WORKERS at a time; seconds taken. Raises naming the first
    request the API server refused (409 AlreadyExists counts as made: a retried request)."""
    began = time.monotonic()
    pending: Iterator[tuple[str, dict[str, Any]]] = iter(requests)
    lock = threading.Lock()
    errors: list[str] = []

    def work() -> None:
        conn = http.client.HTTPSConnection(
            plane.address, plane.port, timeout=30, context=plane.ssl_context()
        )
        try:
            while not errors:
                with lock:
                    item = next(pending, None)
                if item is None:
                    return
                path, body = item
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                reply = conn.getresponse()
                text = reply.read()
                if reply.status not in (200, 201, 409):
                    errors.append(f"POST {path}: {reply.status} {text[:300]!r}")
        except OSError as e:
            errors.append(f"connection: {e}")
        finally:
            conn.close()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"loading the API server: {errors[0]}")
    return time.monotonic() - began


def load_cluster(plane: ControlPlane, *, namespaces: int, pods: int) -> Loaded:
    """`namespaces` namespaces (a quarter labelled for ambient), then `pods` pods spread over
    OTHER_NODES nodes that are not the agent's, in the first POD_NAMESPACES namespaces."""
    ns_seconds = create_all(
        plane, [("/api/v1/namespaces", namespace_body(i)) for i in range(namespaces)]
    )
    holders = [namespace_name(i) for i in range(min(POD_NAMESPACES, namespaces))]
    began = time.monotonic()
    for name in holders:  # pod admission needs the namespace's default ServiceAccount
        wait_service_account(plane, name)
    requests = [
        (f"/api/v1/namespaces/{holders[i % len(holders)]}/pods", pod_body(i)) for i in range(pods)
    ]
    pods_seconds = time.monotonic() - began + create_all(plane, requests)
    return Loaded(namespaces, pods, ns_seconds, pods_seconds)


def wait_service_account(plane: ControlPlane, namespace: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"
    while plane.get(path)[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no default ServiceAccount in {namespace} after {timeout}s")
        time.sleep(0.1)
