"""Helpers of the check's tests: run it in process, and make the cluster objects it reads
(Nodes, namespaces, DaemonSets, agent pods with their status, Events) on the real API server.
No kubelet and no DaemonSet controller run in the cluster tier: an agent pod is what the test
writes, its status patched as a kubelet would."""

from __future__ import annotations

import io
import json
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.check.cli import main

COMPONENT = {"app.kubernetes.io/component": "cni-node-agent"}
IMAGE = "registry.invalid/istio-cni:1"


def run_check(*args: str, cluster: Any = None) -> tuple[int, dict[str, dict[str, Any]], str]:
    """(exit code, checks by name, text output) of `check ARGS --json` and of the text form."""
    out = io.StringIO()
    code = main("check", [*args, "--json"], cluster=cluster, out=out)
    checks = {c["name"]: c for c in json.loads(out.getvalue())} if out.getvalue() else {}
    text = io.StringIO()
    assert main("check", list(args), cluster=cluster, out=text) == code
    return code, checks, text.getvalue()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Objects:
    """Makes cluster objects for one test and deletes them all at its end."""

    def __init__(self, core: Any, apps: Any) -> None:
        self.core, self.apps = core, apps
        self.token = secrets.token_hex(3)
        self._nodes: list[str] = []
        self._namespaces: list[str] = []

    def namespace(self, labels: Mapping[str, str] | None = None) -> str:
        name = f"check-{self.token}-{len(self._namespaces)}"
        self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
        self._namespaces.append(name)
        return name

    def node(
        self,
        suffix: str,
        *,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> str:
        name = f"check-{self.token}-{suffix}"
        self.core.create_node(
            {
                "metadata": {"name": name, "labels": {"check": self.token, **(labels or {})}},
                "spec": {"taints": taints or []},
            }
        )
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        self.core.patch_node_status(name, {"status": {"conditions": [ready]}})
        self._nodes.append(name)
        return name

    def daemonset(
        self,
        namespace: str,
        name: str = "istio-cni",
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        tolerations: list[dict[str, str]] | None = None,
        image: str = IMAGE,
    ) -> dict[str, Any]:
        selector = {"app.kubernetes.io/name": "istio-cni", "app.kubernetes.io/instance": name}
        spec = {
            "nodeSelector": {"check": self.token},
            "tolerations": tolerations if tolerations is not None else [{"operator": "Exists"}],
            "hostNetwork": True,
            "containers": [
                {
                    "name": "istio-cni-agent",
                    "image": image,
                    "ports": [{"name": "metrics", "containerPort": 15014}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 15014}},
                }
            ],
        }
        body = {
            "metadata": {
                "name": name,
                "labels": dict(COMPONENT if labels is None else labels),
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": selector}, "spec": spec},
            },
        }
        made = self.apps.create_namespaced_daemon_set(namespace, body)
        return dict(self.apps.api_client.sanitize_for_serialization(made))

    def agent_pod(
        self,
        ds: Mapping[str, Any],
        node: str,
        *,
        ready: bool = True,
        image: str = IMAGE,
        scheduled: bool = True,
        waiting: Mapping[str, str] | None = None,
    ) -> str:
        """A pod of `ds` for `node` with the status a kubelet would give it."""
        ns = ds["metadata"]["namespace"]
        template = ds["spec"]["template"]
        spec = json.loads(json.dumps(template["spec"]))
        spec["containers"][0]["image"] = image
        spec["terminationGracePeriodSeconds"] = 0
        if scheduled:
            spec["nodeName"] = node
        else:
            term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        name = f"{ds['metadata']['name']}-{node[-6:]}-{secrets.token_hex(2)}"
        meta = {"name": name, "labels": template["metadata"]["labels"]}
        self.core.create_namespaced_pod(ns, {"metadata": meta, "spec": spec})
        self.core.patch_namespaced_pod_status(
            name, ns, {"status": _status(ready, scheduled, waiting)}
        )
        return name

    def event(
        self,
        namespace: str,
        kind: str,
        name: str,
        *,
        reason: str,
        message: str,
        host: str = "",
        uid: str | None = None,
    ) -> None:
        self.core.create_namespaced_event(
            namespace,
            {
                "metadata": {"generateName": f"{name}."},
                "involvedObject": {
                    "kind": kind,
                    "name": name,
                    "namespace": namespace,
                    "uid": uid,
                    "apiVersion": "apps/v1" if kind == "DaemonSet" else "v1",
                },
                "reason": reason,
                "message": message,
                "type": "Warning",
                "source": {"component": "istio-cni", "host": host},
                "firstTimestamp": now(),
                "lastTimestamp": now(),
                "count": 3,
            },
        )

    def close(self) -> None:
        for ns in self._namespaces:
            # A deleted namespace's objects stay visible for a while: the next test must not
            # read this one's, so they go now.
            self.core.delete_collection_namespaced_config_map(ns)
            self.core.delete_collection_namespaced_event(ns)
            self.core.delete_collection_namespaced_resource_quota(ns)
            self.apps.delete_collection_namespaced_daemon_set(ns)
            for pod in self.core.list_namespaced_pod(ns).items:
                _ignore_404(
                    self.core.delete_namespaced_pod, pod.metadata.name, ns, grace_period_seconds=0
                )
            _ignore_404(self.core.delete_namespace, ns)
        for node in self._nodes:
            _ignore_404(self.core.delete_node, node)


def _status(ready: bool, scheduled: bool, waiting: Mapping[str, str] | None) -> dict[str, Any]:
    if not scheduled:
        return {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/9 nodes are available: 1 Insufficient cpu.",
                }
            ],
        }
    state: dict[str, Any] = {"running": {"startedAt": now()}}
    if waiting:
        state = {"waiting": dict(waiting)}
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {
                "type": "Ready",
                "status": flag,
                "message": "" if ready else "containers with unready status: [istio-cni-agent]",
            },
        ],
        "containerStatuses": [
            {
                "name": "istio-cni-agent",
                "image": IMAGE,
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": not waiting,
                "state": state,
            }
        ],
    }


def _ignore_404(fn: Any, *args: Any, **kw: Any) -> None:
    try:
        fn(*args, **kw)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def objects(kube_core: Any, kube_apps: Any) -> Iterator[Objects]:
    made = Objects(kube_core, kube_apps)
    try:
        yield made
    finally:
        made.close()
