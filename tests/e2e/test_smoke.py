"""The chart installed, the agent started as its DaemonSet would, one sidecar pod served."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from testbed.cni import CniNode
from testbed.helm import Helm
from testbed.node import NodePods
from tests.e2e.harness import ChartOnNode

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]


def test_agent_from_chart_installs_and_redirects_a_sidecar_pod(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Any],
    cni_node: CniNode,
    node_pods: NodePods,
) -> None:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    installed = chart_on_node.install(helm, "istio-cni-e2e")
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()
    plugins = json.loads(cni_node.conflist_path.read_text())["plugins"]
    assert [p["type"] for p in plugins] == ["bridge", "portmap", "istio-cni"]
    pod = node_pods.create(
        "default",
        "app-1",
        annotations={"sidecar.istio.io/status": "{}"},
        containers=[{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
    )
    sandbox = cni_node.new_sandbox("app-1", "default", pod["metadata"]["uid"])
    cni_node.add(sandbox)
    saved = subprocess.run(
        ["ip", "netns", "exec", sandbox.netns_name, "iptables-nft-save"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "-A OUTPUT -j ISTIO_OUTPUT" in saved
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in saved
    assert agent.stop() == 0
