"""The chart's node restriction policy (ValidatingAdmissionPolicy) on the test bed's real
kube-apiserver: the agent's identity of node A, a token bound to its pod on node A as kubelet
projects it, may change node A's pods and Node only. With the policy off, RBAC alone lets that
same token change node B's pods and Node (what the policy is for); with it on (the default where
the API server serves it), the API server refuses them naming the node, and still allows the
agent's work on its own node. A token bound to no pod (no node) may change nothing."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from agent.repair import actions
from testbed import parts
from testbed.helm import Helm
from testbed.identity import Identity
from testbed.node import NodePods, register_node
from testbed.wait import wait_for

pytestmark = [pytest.mark.chart, pytest.mark.cluster, pytest.mark.hostile]

CHART = parts.REPO_ROOT / "charts" / "istio-cni"
RELEASE = "istio-cni"
# Every mutating right the chart can grant: deletes (repair delete mode), pods/status (ambient),
# nodes patch (removeNotReadyTaint), events create and patch (refusals, repair).
VALUES = {"repair": {"mode": "delete"}, "ambient": {"enabled": True}, "removeNotReadyTaint": True}
POLICY_LOAD_TIMEOUT = 30.0  # the API server loads a new policy in the background


def status(call: Callable[[], Any]) -> tuple[int | None, str]:
    """(HTTP status the API server refused the call with, its message); (None, "") if allowed."""
    try:
        call()
    except ApiException as e:
        return int(e.status), str(e.body)
    return None, ""


class Cluster:
    """Nodes A and B, a pod on each, the agent's pod on A and clients holding its tokens."""

    def __init__(self, core: Any, namespace: str, make_identity: Callable[..., Identity]) -> None:
        self.core, self.namespace, self.make_identity = core, namespace, make_identity
        suffix = secrets.token_hex(3)
        self.node_a, self.node_b = f"policy-a-{suffix}", f"policy-b-{suffix}"
        self.pods_a, self.pods_b = NodePods(core, self.node_a), NodePods(core, self.node_b)
        self.clients: list[Any] = []

    def start(self) -> None:
        for node in (self.node_a, self.node_b):
            register_node(self.core, node)
        for pods in (self.pods_a, self.pods_b):
            pods.create(self.namespace, f"work-{pods.node_name}")

    def agent(self, *, bound: bool = True) -> Any:
        """CoreV1Api as the chart's ServiceAccount: the token of its pod on node A (bound), or
        one bound to nothing."""
        options: dict[str, Any] = {}
        if bound:
            pod = self.pods_a.create(
                self.namespace, f"agent-{secrets.token_hex(2)}", service_account=RELEASE
            )
            options["bound_pod"] = (pod["metadata"]["name"], pod["metadata"]["uid"])
        identity = self.make_identity(self.namespace, RELEASE, **options)
        api = k8s_config.new_client_from_config(config_file=str(identity.kubeconfig))
        self.clients.append(api)
        return k8s.CoreV1Api(api)

    def node_event(self, node: str) -> str:
        """An Event reported as `node`, made by the admin; its name."""
        pod = self.work_pod(node)
        body = actions.event_for(pod, reason="PolicyTest", message="admin's", node_name=node)
        made = self.core.create_namespaced_event(self.namespace, body)
        return str(made.metadata.name)

    def work_pod(self, node: str) -> dict[str, Any]:
        pod = self.core.read_namespaced_pod(f"work-{node}", self.namespace)
        return dict(self.core.api_client.sanitize_for_serialization(pod))

    def close(self) -> None:
        for api in self.clients:
            api.close()
        for pods in (self.pods_a, self.pods_b):
            pods.close()
        for node in (self.node_a, self.node_b):
            try:
                self.core.delete_node(node)
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def cluster(
    kube_core: Any, make_identity: Callable[..., Identity], random_namespace_function_scope: Any
) -> Iterator[Cluster]:
    made = Cluster(kube_core, random_namespace_function_scope.name, make_identity)
    try:
        made.start()
        yield made
    finally:
        made.close()


def writes(agent: Any, cluster: Cluster, node: str) -> dict[str, tuple[int | None, str]]:
    """Each of the agent's writes aimed at `node`: its pod's status, an Event as that node, the
    Node itself."""
    pod = cluster.work_pod(node)
    name = pod["metadata"]["name"]
    label = {"metadata": {"labels": {"policy-test": secrets.token_hex(2)}}}
    return {
        "patch pod status": status(
            lambda: agent.patch_namespaced_pod_status(name, cluster.namespace, label)
        ),
        "event": status(
            lambda: agent.create_namespaced_event(
                cluster.namespace,
                actions.event_for(pod, reason="PolicyTest", message="test", node_name=node),
            )
        ),
        "patch event": status(
            lambda: agent.patch_namespaced_event(
                cluster.node_event(node), cluster.namespace, {"count": 2}
            )
        ),
        "patch node": status(lambda: agent.patch_node(node, label)),
    }


def delete_work_pod(agent: Any, cluster: Cluster, node: str) -> tuple[int | None, str]:
    return status(lambda: actions.delete_pod(agent, cluster.work_pod(node)))


@pytest.mark.parametrize("helm_major", ["3", "4"])
def test_agent_of_node_a_changes_only_node_a(
    helm_major: str,
    helm_binaries: dict[str, Path],
    helm_releases: Callable[[Path], Helm],
    cluster: Cluster,
    kube_core: Any,
) -> None:
    versions = [v for v in helm_binaries if v.split(".")[0] == helm_major]
    assert versions, f"no Helm {helm_major}.x among {sorted(helm_binaries)}"
    helm = helm_releases(helm_binaries[max(versions)])
    ns = cluster.namespace

    # Off: RBAC alone lets node A's agent write node B's objects.
    helm.install(RELEASE, CHART, namespace=ns, values={**VALUES, "nodeRestrictionPolicy": False})
    agent = cluster.agent()
    assert {k: v[0] for k, v in writes(agent, cluster, cluster.node_b).items()} == {
        "patch pod status": None,
        "event": None,
        "patch event": None,
        "patch node": None,
    }

    # The default: the API server serves the policy API, so the chart installs the policy.
    answer = helm.upgrade(RELEASE, CHART, namespace=ns, values=VALUES)
    assert "ValidatingAdmissionPolicy" in answer["manifest"]
    wait_for(
        lambda: writes(agent, cluster, cluster.node_b)["patch node"][0] == 403,
        "the policy to be in force",
        POLICY_LOAD_TIMEOUT,
    )
    refused = writes(agent, cluster, cluster.node_b)
    assert {k: v[0] for k, v in refused.items()} == {
        "patch pod status": 403,
        "event": 403,
        "patch event": 403,
        "patch node": 403,
    }
    assert (
        f"istio-cni agent of node {cluster.node_a} may only change pods on its own node"
        in (refused["patch pod status"][1])
    )
    assert f"may only change its own Node, not {cluster.node_b}" in refused["patch node"][1]
    code, message = delete_work_pod(agent, cluster, cluster.node_b)
    assert code == 403 and "may only change pods on its own node" in message
    assert kube_core.read_namespaced_pod(f"work-{cluster.node_b}", ns).metadata.uid

    # Its own node: everything the agent does there still works.
    assert {k: v[0] for k, v in writes(agent, cluster, cluster.node_a).items()} == {
        "patch pod status": None,
        "event": None,
        "patch event": None,
        "patch node": None,
    }
    assert delete_work_pod(agent, cluster, cluster.node_a) == (None, "")

    # A token of the same ServiceAccount that names no node: nothing.
    unbound = cluster.agent(bound=False)
    for what, (code, message) in writes(unbound, cluster, cluster.node_b).items():
        assert code == 403 and "names no node" in message, what
    # Others are not concerned: the admin still writes node B's objects.
    kube_core.patch_node(cluster.node_b, {"metadata": {"labels": {"policy-test": "admin"}}})
