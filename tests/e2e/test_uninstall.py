"""helm uninstall: the DaemonSet, its RBAC and ServiceAccount go; the agent, on SIGTERM, removes
its entry and binaries, and pods started afterwards run through the node's own chain only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.cni import CniNode
from testbed.helm import Helm
from testbed.node import NodePods
from testbed.podnet import has_istio_rules
from testbed.wait import wait_for
from tests.e2e.harness import RELEASE, ChartOnNode, helm_binary

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]

NAMESPACE = "istio-cni-e2e"
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": "{}"},
    "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
}


@pytest.mark.parametrize("helm_version", ["3", "4"], ids=["helm3", "helm4"])
def test_uninstall_removes_entry_and_binaries(
    helm_version: str,
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
) -> None:
    helm: Helm = helm_releases(helm_binary(helm_binaries, helm_version))
    reference = json.loads(cni_node.conflist_path.read_text())
    bin_before = sorted(p.name for p in cni_node.bin_dir.iterdir())
    installed = chart_on_node.install(helm, NAMESPACE)
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()
    assert json.loads(cni_node.conflist_path.read_text()) != reference

    helm.uninstall(RELEASE, namespace=NAMESPACE)

    # The garbage collector deletes the DaemonSet's pod; the kubelet then sends SIGTERM.
    def agent_pod_terminating() -> bool:
        pod = kube_core.read_namespaced_pod(installed.agent_pod, NAMESPACE)
        return pod.metadata.deletion_timestamp is not None

    wait_for(agent_pod_terminating, "the agent pod to be deleted by the garbage collector")
    assert agent.stop() == 0
    chart_on_node.release_agent_pod(NAMESPACE, installed.agent_pod)
    # helm removed the ServiceAccount's RBAC with the DaemonSet: the agent is refused now, but
    # its watch of its own DaemonSet saw the deletion while its credentials still counted: the
    # definite answer that uninstalls. It removes what it installed.
    logs = agent.logs()
    assert "watch saw the DaemonSet deleted" in logs and "msg=uninstalled" in logs, logs

    assert json.loads(cni_node.conflist_path.read_text()) == reference
    assert sorted(p.name for p in cni_node.bin_dir.iterdir()) == bin_before
    assert not list(cni_node.bin_dir.glob("istio-cni*"))

    # A sidecar pod now starts through bridge + host-local + portmap alone, without rules.
    pod = node_pods.create("default", "after-uninstall", **SIDECAR)
    sandbox = cni_node.new_sandbox("after-uninstall", "default", pod["metadata"]["uid"])
    result = cni_node.add(sandbox)
    assert result["ips"], result
    assert not has_istio_rules(sandbox.netns_name)
    cni_node.delete(sandbox)
