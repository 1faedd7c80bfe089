"""The agent's REST client (agent.kube.rest) against the test bed's real kube-apiserver: each
call it makes, through agent.kube.api as the agent makes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agent.errors import ApiConflict, ApiNotFound
from agent.kube import KubeClients, api, build_clients
from agent.repair.actions import event_for
from testbed.node import NodePods

pytestmark = pytest.mark.cluster


@pytest.fixture
def clients(kube_config: str) -> Iterator[KubeClients]:
    made = build_clients({"KUBECONFIG": kube_config})
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def namespace(random_namespace_function_scope: Any) -> str:
    return str(random_namespace_function_scope.name)


def test_pods_listed_watched_read_patched_and_deleted(
    clients: KubeClients, node_pods: NodePods, namespace: str
) -> None:
    core = clients.core
    for i in range(3):
        node_pods.create(namespace, f"web-{i}")
    selector = f"spec.nodeName={node_pods.node_name}"
    first = api.get_json(
        core.list_pod_for_all_namespaces, field_selector=selector, limit=2, timeout=5.0
    )
    assert len(first["items"]) == 2 and first["metadata"]["continue"]
    rest = api.get_json(
        core.list_pod_for_all_namespaces,
        field_selector=selector,
        limit=2,
        _continue=first["metadata"]["continue"],
        timeout=5.0,
    )
    names = {p["metadata"]["name"] for p in first["items"] + rest["items"]}
    assert {"web-0", "web-1", "web-2"} <= names
    version = rest["metadata"]["resourceVersion"]
    pod = api.get_json(core.read_namespaced_pod, "web-0", namespace, timeout=5.0)
    assert pod["metadata"]["uid"]
    patch = {"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}}
    api.call(core.patch_namespaced_pod_status, "web-0", namespace, patch, timeout=5.0, raw=False)
    watch = api.call(
        core.list_pod_for_all_namespaces,
        field_selector=selector,
        watch=True,
        allow_watch_bookmarks=True,
        resource_version=version,
        timeout_seconds=1,
        timeout=(5.0, 10.0),
    )
    body = b"".join(watch.stream(amt=None, decode_content=False))
    watch.release_conn()
    events = [json.loads(line) for line in body.splitlines() if line.strip()]
    modified = [e["object"] for e in events if e["type"] == "MODIFIED"]
    assert any(
        (p["metadata"].get("annotations") or {}).get("ambient.istio.io/redirection") == "enabled"
        for p in modified
    ), events
    stale = {"preconditions": {"uid": pod["metadata"]["uid"], "resourceVersion": "1"}}
    with pytest.raises(ApiConflict):
        api.call(core.delete_namespaced_pod, "web-1", namespace, body=stale, timeout=5.0)
    with pytest.raises(ApiNotFound):
        api.get_json(core.read_namespaced_pod, "nope", namespace, timeout=5.0)


def test_nodes_namespaces_events_and_daemonsets(
    clients: KubeClients, sim_node: str, namespace: str
) -> None:
    core = clients.core
    node = api.get_json(core.read_node, sim_node, timeout=5.0)
    assert node["metadata"]["name"] == sim_node
    test_op = [{"op": "test", "path": "/metadata/name", "value": sim_node}]
    api.call(core.patch_node, sim_node, test_op, timeout=5.0, raw=False)
    assert api.get_json(core.read_namespace, namespace, timeout=5.0)["metadata"]["name"]
    listed = api.get_json(core.list_namespace, limit=1, timeout=5.0)
    assert len(listed["items"]) == 1
    pod = {"metadata": {"name": "some-pod", "namespace": namespace, "uid": "u-1"}}
    event = event_for(pod, reason="Test", message="from agent.kube.rest", node_name=sim_node)
    made = api.get_json(core.create_namespaced_event, namespace, event, timeout=5.0)
    patch = {"count": 2, "message": "again"}
    name = made["metadata"]["name"]
    api.call(core.patch_namespaced_event, name, namespace, patch, timeout=5.0, raw=False)
    with pytest.raises(ApiNotFound):
        api.get_json(clients.apps.read_namespaced_daemon_set, "none", namespace, timeout=5.0)
