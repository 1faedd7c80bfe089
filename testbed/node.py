"""A simulated node: a Ready `Node` object and pods bound to it the way the scheduler binds them
(spec.nodeName set at creation). No kubelet runs; tests play its part (CNI calls, pod status)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

# Nothing pulls images here; an unresolvable registry makes an accidental pull fail loudly.
DEFAULT_IMAGE = "registry.invalid/testbed/app:1"
POD_CREATE_TIMEOUT = 30.0


def register_node(
    core: Any, name: str, *, pod_cidr: str = "10.244.0.0/24", address: str = "127.0.0.1"
) -> dict[str, Any]:
    """Create the Node object with status Ready, as a kubelet registering itself would."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated node",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
        },
    }
    created = core.create_node(body)
    # Status on create is kept for nodes, but be explicit: the status subresource is what counts.
    core.patch_node_status(name, {"status": body["status"]})
    return dict(core.api_client.sanitize_for_serialization(created))


def pod_manifest(
    name: str,
    node_name: str,
    *,
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    host_network: bool = False,
    service_account: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "containers": [dict(c) for c in containers]
        if containers
        else [{"name": "app", "image": DEFAULT_IMAGE}],
        "terminationGracePeriodSeconds": 0,
    }
    if init_containers:
        spec["initContainers"] = [dict(c) for c in init_containers]
    if host_network:
        spec["hostNetwork"] = True
    if service_account:
        spec["serviceAccountName"] = service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


class NodePods:
    """Creates pods bound to one node and deletes every one it made on close()."""

    def __init__(self, core: Any, node_name: str) -> None:
        self.core = core
        self.node_name = node_name
        self._made: list[tuple[str, str]] = []

    def create(self, namespace: str, name: str, **options: Any) -> dict[str, Any]:
        """Create a pod bound to the node (options: see pod_manifest); returns it as a dict."""
        body = pod_manifest(name, self.node_name, **options)
        deadline = time.monotonic() + POD_CREATE_TIMEOUT
        while True:
            try:
                pod = self.core.create_namespaced_pod(namespace, body)
                break
            except ApiException as e:
                # A brand-new namespace gets its default ServiceAccount a moment later.
                if (
                    e.status == 403
                    and "serviceaccount" in str(e.body)
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.2)
                    continue
                raise
        self._made.append((namespace, name))
        return dict(self.core.api_client.sanitize_for_serialization(pod))

    def set_running(self, namespace: str, name: str, pod_ip: str) -> dict[str, Any]:
        """Report the pod Running with `pod_ip`, as the kubelet does after the CNI ADD."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Running",
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
        }
        pod = self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
        return dict(self.core.api_client.sanitize_for_serialization(pod))

    def delete(self, namespace: str, name: str) -> None:
        """Delete at once: with no kubelet, a graceful delete of a bound pod never finishes."""
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
        if (namespace, name) in self._made:
            self._made.remove((namespace, name))

    def close(self) -> None:
        errors = []
        for namespace, name in list(self._made):
            try:
                self.delete(namespace, name)
            except ApiException as e:
                errors.append(f"{namespace}/{name}: {e.status} {e.reason}")
        if errors:
            raise RuntimeError("could not delete test pods: " + "; ".join(errors))


def new_core(kubeconfig: str) -> Any:
    """A CoreV1Api for `kubeconfig` (its own ApiClient: close with .api_client.close())."""
    from kubernetes import config as k8s_config

    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]


class TerminationFinisher:
    """The kubelet's last step of a pod deletion, for the simulated node: a graceful delete only
    marks a bound pod (deletionTimestamp) and the kubelet removes it once its containers are
    gone. With no kubelet, this thread does that removal, so namespaces of tests can be deleted.
    """

    def __init__(self, core: Any, node_name: str) -> None:
        self.core = core
        self.node_name = node_name
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"finish-terminating-{node_name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        while not self._stop.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self._finish(pod)
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=2,  # short, so stop() is noticed soon
                )
                for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._finish(event["object"])
            except Exception:  # the API server going away at the end of the session
                if not self._stop.is_set():
                    log.exception("watching pods of node %s", self.node_name)
                self._stop.wait(0.5)

    def _finish(self, pod: Any) -> None:
        meta = pod.metadata
        if meta.deletion_timestamp is None:
            return
        try:
            self.core.delete_namespaced_pod(
                meta.name,
                meta.namespace,
                grace_period_seconds=0,
                body={"preconditions": {"uid": meta.uid}},
            )
        except ApiException as e:
            if e.status not in (404, 409):  # already gone / a newer pod of that name
                raise
