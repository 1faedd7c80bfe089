"""The SIGTERM decision against the real API server: an agent pod owned by a DaemonSet on the
simulated node, and the DaemonSet kept, moved off the node, being deleted, and gone.

The test bed runs no DaemonSet controller, so the pod is created as that controller would create
it (owner reference with controller: true, bound to the node); the garbage collector is real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agent.install import conflist
from agent.install.stop_policy import decide, fetch_state
from agent.kube import KubeClients, build_clients
from testbed.agent_host import Node, agent_command, agent_env, http_get
from testbed.ports import free_port
from testbed.wait import wait_for

pytestmark = pytest.mark.cluster

HOLD = "test.istio-cni.io/hold"
LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


@pytest.fixture
def clients(kube_config: str) -> Iterator[KubeClients]:
    made = build_clients()  # $KUBECONFIG points at the test bed's API server
    try:
        yield made
    finally:
        made.close()


def _daemonset(node: str) -> dict[str, Any]:
    labels = {"app": "istio-cni-stop-test"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "istio-cni-node", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "agent", "image": "example.invalid/agent:1"}],
                    "tolerations": [{"operator": "Exists"}],
                },
            },
        },
    }


def _clear_finalizers(kube_core: Any, kube_apps: Any, namespace: str, pod: str) -> None:
    for patch in (
        lambda: kube_core.patch_namespaced_pod(pod, namespace, {"metadata": {"finalizers": None}}),
        lambda: kube_apps.patch_namespaced_daemon_set(
            "istio-cni-node", namespace, {"metadata": {"finalizers": None}}
        ),
    ):
        try:
            patch()
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.fixture
def agent_pod(
    kube_core: Any, kube_apps: Any, sim_node: str, random_namespace_function_scope: Any
) -> Iterator[tuple[str, str]]:
    """(namespace, pod name) of an agent pod owned by DaemonSet istio-cni-node."""
    namespace = random_namespace_function_scope.name
    ds = kube_apps.create_namespaced_daemon_set(namespace, _daemonset(sim_node))
    pod = "istio-cni-node-abcde"
    template = _daemonset(sim_node)["spec"]["template"]
    kube_core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "labels": template["metadata"]["labels"],
                # Held by a finalizer so it outlives its deletion, as a terminating agent pod does.
                "finalizers": [HOLD],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": ds.metadata.name,
                        "uid": ds.metadata.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**template["spec"], "nodeName": sim_node},
        },
    )
    try:
        yield namespace, pod
    finally:
        _clear_finalizers(kube_core, kube_apps, namespace, pod)
        try:  # no kubelet confirms the end of its containers: delete it for good
            kube_core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
        wait_for(lambda: not kube_core.list_namespaced_pod(namespace).items, "the pod to be gone")


def test_decision_follows_the_daemonset(
    clients: KubeClients, kube_apps: Any, sim_node: str, agent_pod: tuple[str, str]
) -> None:
    namespace, pod = agent_pod

    def state() -> Any:
        return fetch_state(clients, pod_name=pod, pod_namespace=namespace, node_name=sim_node)

    upgrade = decide("auto", state())
    assert upgrade.uninstall is False, upgrade.reason

    kube_apps.patch_namespaced_daemon_set(
        "istio-cni-node",
        namespace,
        {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": "elsewhere"}}}}},
    )
    moved = decide("auto", state())
    assert moved.uninstall is True and "no longer matches" in moved.reason
    kube_apps.patch_namespaced_daemon_set(
        "istio-cni-node",
        namespace,
        {"spec": {"template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": sim_node}}}}},
    )

    kube_apps.patch_namespaced_daemon_set(
        "istio-cni-node", namespace, {"metadata": {"finalizers": [HOLD]}}
    )
    kube_apps.delete_namespaced_daemon_set("istio-cni-node", namespace)
    deleting = decide("auto", state())
    assert deleting.uninstall is True and "being deleted" in deleting.reason

    kube_apps.patch_namespaced_daemon_set(
        "istio-cni-node", namespace, {"metadata": {"finalizers": None}}
    )
    wait_for(
        lambda: decide("auto", state()).reason == "DaemonSet is gone", "the DaemonSet to be gone"
    )
    assert decide("never", state()).uninstall is False


@pytest.mark.parametrize("daemonset_deleted", [False, True], ids=["upgrade", "ds-deleted"])
def test_run_on_sigterm_asks_the_api_server(
    kube_apps: Any,
    sim_node: str,
    agent_pod: tuple[str, str],
    kube_config: str,
    node: Node,
    daemonset_deleted: bool,
) -> None:
    namespace, pod = agent_pod
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    (node.bin_dir / "ptp").write_bytes(b"")  # the primary's plugin: the runtime's bin dir
    port = free_port()
    config = node.write_config_yaml(metricsPort=port, uninstallOnStop="auto")
    env = agent_env(
        KUBECONFIG=kube_config, POD_NAME=pod, POD_NAMESPACE=namespace, NODE_NAME=sim_node
    )
    with open(node.root / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            agent_command("run", "--config", str(config)), env=env, stdout=log, stderr=log
        )
    try:
        wait_for(lambda: _ready(port), "the agent to be ready", timeout=30)
        if daemonset_deleted:
            kube_apps.delete_namespaced_daemon_set("istio-cni-node", namespace)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    log_text = (node.root / "agent.log").read_text()
    installed = conflist.count_ours(json.loads((node.conf_dir / "10-net.conflist").read_text()))
    if daemonset_deleted:
        assert "DaemonSet is gone" in log_text
        assert installed == 0 and os.listdir(node.bin_dir) == ["ptp"]
    else:
        assert "DaemonSet still runs on this node" in log_text
        assert installed == 1 and sorted(os.listdir(node.bin_dir)) == ["istio-cni", "ptp"]


def _ready(port: int) -> bool:
    try:
        return http_get(port, "/readyz")[0] == 200
    except OSError:
        return False
