"""Pods created through the API, placed by kube-scheduler and started by kubelet through
containerd's CNI chain (bridge, portmap, istio-cni): a pod as Istio's injector leaves it is
captured, real connections reaching its Envoy double with the right SO_ORIGINAL_DST; a plain pod
is untouched. The agent's log, read through the API's pod log endpoint, shows the plugin's lines
for both."""

from __future__ import annotations

from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
APP_PORT = 8080


def test_sidecar_pod_captured_plain_pod_untouched(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    agent = agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    image = real_cluster.images["workload"].ref
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    for name, sidecar in (("with-sidecar", True), ("plain", False)):
        node_core.create_namespaced_pod(
            workload_ns, kubepods.pod_manifest(name, image, app_command=loop, sidecar=sidecar)
        )
    captured = kubepods.wait_running(node_core, workload_ns, "with-sidecar")
    plain = kubepods.wait_running(node_core, workload_ns, "plain")
    assert captured.node == plain.node == real_cluster.node_name  # placed by the scheduler
    assert captured.ip and plain.ip

    # Outbound: the app's own connections to an outside address reach the proxy's 15001.
    line = kubepods.wait_log_line(
        node_core,
        workload_ns,
        "with-sidecar",
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a connection answered by the proxy",
    )
    assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
    app_log = kubepods.logs(node_core, workload_ns, "with-sidecar", "app")
    assert not any(kubepods.escaped(s) for s in app_log.splitlines()), app_log[-2000:]
    kubepods.wait_log_line(
        node_core,
        workload_ns,
        "with-sidecar",
        "istio-proxy",
        lambda s: (
            f"port=15001 peer={captured.ip}:" in s
            and f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in s
        ),
        "the proxy's side of it",
    )

    # Inbound: to the pod's IP from the node and from another pod: the proxy's 15006.
    node_side = podnet.connect(real_cluster.network.netns_path, captured.ip, APP_PORT)
    assert node_side.startswith("proxy-double port=15006"), node_side
    assert f"original_dst={captured.ip}:{APP_PORT}" in node_side, node_side
    plain_netns = real_cluster.pod_netns(plain.uid)
    pod_side = podnet.connect(plain_netns, captured.ip, APP_PORT)
    assert pod_side.startswith("proxy-double port=15006"), pod_side
    assert f"peer={plain.ip}:" in pod_side and f"original_dst={captured.ip}:{APP_PORT}" in pod_side

    # The plain pod: its connections out fail as unreachable, no rule in its netns.
    line = kubepods.wait_log_line(
        node_core,
        workload_ns,
        "plain",
        "app",
        lambda s: f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in s,
        "a connection attempt",
    )
    assert kubepods.escaped(line) and "unreachable" in line, line
    assert "proxy-double" not in kubepods.logs(node_core, workload_ns, "plain", "app")
    assert not podnet.has_istio_rules(plain_netns), podnet.saved_rules(plain_netns)
    assert podnet.has_istio_rules(real_cluster.pod_netns(captured.uid))

    # The plugin's lines for both pods, in the agent's log through the API.
    logs = agent.logs(node_core)
    for pod in ("with-sidecar", "plain"):
        ours = [
            s for s in logs.splitlines() if "source=plugin" in s and f"pod={workload_ns}/{pod}" in s
        ]
        assert ours, f"no plugin line for {pod} in the agent log:\n{logs[-4000:]}"
