"""helm install (default values, then a platform preset), the agent run as its DaemonSet would
with the rendered config.yaml and the chart's ServiceAccount, and pods started through the node's
real CNI chain: a sidecar pod redirected (real connections reach the proxy ports), pods in an
excluded namespace or without a sidecar untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from testbed.cni import CniNode
from testbed.daemon import REPO_ROOT
from testbed.helm import Helm
from testbed.node import NodePods
from testbed.podnet import (
    INBOUND_PORT,
    OUTBOUND_PORT,
    connect,
    has_istio_rules,
    pod_ip,
    proxy_in,
    saved_rules,
)
from tests.e2e.harness import ChartOnNode
from tests.e2e.scrape import metric_value

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]

NAMESPACE = "istio-cni-e2e"
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": "{}"},
    "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
}
PRESETS = {
    "default": (),
    **{name: (REPO_ROOT / "values-examples" / f"{name}.yaml",) for name in ("kind", "k3s")},
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_installed_agent_serves_the_node(
    preset: str,
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
    kube_core: Any,
) -> None:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    reference = json.loads(cni_node.conflist_path.read_text())
    installed = chart_on_node.install(helm, NAMESPACE, values_files=PRESETS[preset])
    config = yaml.safe_load(installed.config_yaml(kube_core))
    for values_file in PRESETS[preset]:  # the node paths of the preset reach the agent
        wanted = yaml.safe_load(values_file.read_text())
        assert (config["cniBinDir"], config["cniConfDir"]) == (
            wanted["cniBinDir"],
            wanted["cniConfDir"],
        )
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()

    # Chained after the node's own plugins, configured from the ConfigMap, no credential.
    conf = json.loads(cni_node.conflist_path.read_text())
    assert conf["plugins"][:-1] == reference["plugins"]
    ours = conf["plugins"][-1]
    assert ours == {
        "name": "istio-cni",
        "type": "istio-cni",
        "plugin_log_level": config["logLevel"],
        "cni_agent_run_dir": config["cniAgentRunDir"],
        "exclude_namespaces": config["excludeNamespaces"],
        # The agent's pods by their DaemonSet's name, not this pod's: a rollout leaves it alone.
        "pod_namespace": NAMESPACE,
        # The plugin's plain-pod rule while the agent is away: ambient's switch, and the pod's
        # annotations from the runtime.
        "ambient_enabled": False,
        "capabilities": {"io.kubernetes.cri.pod-annotations": True},
        "agent_pod_prefix": config["daemonSetName"] + "-",
    }
    assert installed.agent_pod.startswith(ours["agent_pod_prefix"])
    assert (cni_node.bin_dir / "istio-cni").is_file()
    assert sorted(p.name for p in cni_node.bin_dir.glob("istio-cni*")) == ["istio-cni"], (
        "the plugin is one file"
    )

    sidecar = node_pods.create("default", "meshed", **SIDECAR)
    plain = node_pods.create("default", "plain")
    excluded = node_pods.create("kube-system", "system", **SIDECAR)
    boxes = {
        name: cni_node.new_sandbox(name, pod["metadata"]["namespace"], pod["metadata"]["uid"])
        for name, pod in (("meshed", sidecar), ("plain", plain), ("system", excluded))
    }
    results = {name: cni_node.add(box) for name, box in boxes.items()}
    gateway = str(results["meshed"]["ips"][0]["gateway"])

    meshed = boxes["meshed"]
    rules = saved_rules(meshed.netns_name)
    assert "-A OUTPUT -p tcp -j ISTIO_OUTPUT" in rules or "-A OUTPUT -j ISTIO_OUTPUT" in rules
    assert f"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}" in rules
    assert f"-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports {INBOUND_PORT}" in rules
    with proxy_in(meshed):
        # Outbound: to the node's bridge address, where nothing listens on port 9.
        assert connect(meshed.netns_name, gateway, 9) == f"outbound|{gateway}:9"
        # Inbound: from the node to the pod's application port.
        ip = pod_ip(results["meshed"])
        assert connect(cni_node.netns_name, ip, 8080) == f"inbound|{ip}:8080"
    cni_node.check(meshed)

    for name in ("plain", "system"):
        box = boxes[name]
        assert not has_istio_rules(box.netns_name), f"{name}: rules in a pod not to redirect"
        with proxy_in(box):
            # No redirect: the connection goes to the node, which refuses it.
            assert connect(box.netns_name, gateway, 9) == "error|ConnectionRefusedError"
    for box in boxes.values():
        cni_node.delete(box)

    status, metrics = agent.get("/metrics")
    assert status == 200
    assert metric_value(metrics, "istio_cni_install_ready") == 1.0
    assert metric_value(metrics, "istio_cni_installs_total", result="success") >= 1.0
    # The plugin passes the excluded namespace by itself: only two pods reached the agent.
    assert (
        metric_value(metrics, "istio_cni_plugin_requests_total", command="add", result="redirected")
        == 1.0
    )
    assert (
        metric_value(metrics, "istio_cni_plugin_requests_total", command="add", result="skipped")
        == 1.0
    )
    assert (
        metric_value(
            metrics, "istio_cni_plugin_requests_total", command="check", result="redirected"
        )
        == 1.0
    )
    assert agent.get("/healthz")[0] == 200
    logs = agent.logs()
    assert "default/meshed" in logs and "redirected" in logs
    assert agent.token not in logs, "the ServiceAccount token was logged"
    assert agent.stop() == 0
