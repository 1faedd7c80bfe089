"""What testbed/reboot.py asks the API server after a node's reboot, on a cluster of several
nodes (the soak's bed): only the rebooted node's kubelet's Events say its pods are recreated,
only its agent pod is replaced, and an API server that does not answer is waited through. The
kubernetes client talks to the strict fake API server (testbed/fakeapi.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from testbed import reboot
from testbed.fakeapi import FakeApiServer, Reply, Request

NODE, OTHER = "tb-node-2", "tb-node-1"


def event(name: str, namespace: str, reason: str, host: str, at: float) -> dict[str, Any]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return {
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name.split(".")[0]},
        "reason": reason,
        "source": {"component": "kubelet", "host": host},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }


def agent_pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"nodeName": node, "containers": [{"name": "install-cni"}]},
    }


@pytest.fixture
def core(fake_api: FakeApiServer) -> Iterator[Any]:
    client = kubernetes.config.new_client_from_config(config_file=str(fake_api.kubeconfig()))
    try:
        yield kubernetes.client.CoreV1Api(client)
    finally:
        client.close()


def test_only_the_rebooted_nodes_kubelet_says_its_pods_are_recreated(
    fake_api: FakeApiServer, core: Any
) -> None:
    since = time.time() - 5
    events = [
        event("web-0.1", "soak", "Started", OTHER, since + 2),  # another node's churn
        event("istio-cni-x.1", "kube-system", "SandboxChanged", NODE, since + 2),  # the agent's
        event("web-1.1", "soak", "SandboxChanged", NODE, since - 60),  # before the reboot
    ]

    def route(request: Request) -> Reply:
        assert request.path == "/api/v1/events", request
        return Reply(body={"kind": "EventList", "apiVersion": "v1", "items": events})

    fake_api.route = route
    assert reboot._sandbox_changed_since(core, NODE, since) is None
    events.append(event("web-1.2", "soak", "SandboxChanged", NODE, since + 3))
    assert reboot._sandbox_changed_since(core, NODE, since) is not None


def test_only_the_rebooted_nodes_agent_pod_is_replaced(fake_api: FakeApiServer, core: Any) -> None:
    pods = [agent_pod("istio-cni-a", NODE), agent_pod("istio-cni-b", OTHER)]

    def route(request: Request) -> Reply:
        if request.method == "GET":
            selector = request.query.get("fieldSelector", "")
            items = [p for p in pods if selector == f"spec.nodeName={p['spec']['nodeName']}"]
            return Reply(body={"kind": "PodList", "apiVersion": "v1", "items": items})
        name = request.path.rsplit("/", 1)[1]  # the API server answers with the pod deleted
        return Reply(body={"kind": "Pod", "apiVersion": "v1", **agent_pod(name, NODE)})

    fake_api.route = route
    assert reboot._replace_agent_pod(core, NODE)
    deleted = [r.path for r in fake_api.seen("DELETE")]
    assert deleted == ["/api/v1/namespaces/kube-system/pods/istio-cni-a"]
    assert fake_api.seen("DELETE")[0].query == {"gracePeriodSeconds": "0"}


def test_an_api_server_that_does_not_answer_is_not_yet_an_answer(
    tmp_path: Path, fake_api: FakeApiServer, core: Any
) -> None:
    fake_api.route = lambda request: Reply(503)
    assert reboot._answered(lambda: reboot._replace_agent_pod(core, NODE)) is None
    fake_api.stop()  # connection refused
    core.api_client.configuration.retries = 0
    assert reboot._answered(lambda: reboot._sandbox_changed_since(core, NODE, 0.0)) is None
