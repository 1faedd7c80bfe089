"""Readiness on the real node: with a wrong `cniNetnsDir` the agent pod runs (kubelet creates the
wrong dir for the hostPath) but stays not Ready, its /readyz, its log and istio_cni_ready_check
naming the check and the value, while every other check passes; `helm upgrade` to the runtime's
dir makes it Ready. A plain pod started before the agent gives the node a pod namespace."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from agent.netns import run_in_netns
from testbed import chart as agent_mod
from testbed import kubepods
from testbed.agent_host import http_get
from testbed.images import Image
from testbed.realnode import RealCluster
from testbed.wait import wait_for

pytestmark = [pytest.mark.node]

PORT = 15014  # the chart's default metricsPort, in the node's own network namespace
OTHER_CHECKS = ("install", "pod-socket", "api", "rules")


def agent_http(cluster: RealCluster, path: str) -> tuple[int, str]:
    """GET on the agent's port from inside the node's network namespace (hostNetwork)."""
    return run_in_netns(cluster.network.netns_path, lambda: http_get(PORT, path))


def test_a_wrong_netns_dir_keeps_the_agent_not_ready_naming_it(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    image = real_cluster.images["workload"].ref
    loop = ["connect-loop", "203.0.113.10", "80", "5"]
    node_core.create_namespaced_pod(
        workload_ns, kubepods.pod_manifest("plain", image, app_command=loop, sidecar=False)
    )
    kubepods.wait_running(node_core, workload_ns, "plain")

    wrong = real_cluster.base / "run" / "netns-typo"  # kubelet makes it (DirectoryOrCreate)
    helm = node_helm("4")
    try:
        helm.install(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=agent_mod.node_values(real_cluster, agent_image, cniNetnsDir=str(wrong)),
        )

        def not_ready_naming_it() -> str | None:
            try:
                code, body = agent_http(real_cluster, "/readyz")
            except OSError:
                return None  # not listening yet
            return body if code == 503 and "\nnetns-dir: " in body else None

        body = wait_for(
            not_ready_naming_it,
            "the agent's /readyz to name netns-dir",
            agent_mod.READY_TIMEOUT,
            on_timeout=lambda: "\n".join(
                kubepods.logs(
                    node_core, agent_mod.AGENT_NAMESPACE, p.metadata.name, agent_mod.AGENT_CONTAINER
                )[-3000:]
                for p in agent_mod.agent_pods(node_core)
            ),
        )
        assert body.splitlines()[0] == "not ready: netns-dir", body
        assert f"netns-dir: cniNetnsDir {wrong} holds none of the network namespaces" in body
        metrics = agent_http(real_cluster, "/metrics")[1]
        assert 'istio_cni_ready_check{check="netns-dir"} 0.0' in metrics
        for check in OTHER_CHECKS:  # in the pod: the scratch netns, the socket, the API
            assert f'istio_cni_ready_check{{check="{check}"}} 1.0' in metrics, check

        # kubelet's probe agrees, for longer than its failure threshold: running, not Ready.
        time.sleep(20)
        (pod,) = agent_mod.agent_pods(node_core)
        view = kubepods.PodView.of(pod)
        assert view.phase == "Running" and not view.ready, view
        assert view.containers[agent_mod.AGENT_CONTAINER]["restarts"] == 0, view
        log = kubepods.logs(
            node_core, agent_mod.AGENT_NAMESPACE, view.name, agent_mod.AGENT_CONTAINER
        )
        failed = [line for line in log.splitlines() if "readiness check fails" in line]
        netns_lines = [line for line in failed if "check=netns-dir" in line]
        assert len(netns_lines) == 1 and str(wrong) in netns_lines[0], log[-3000:]

        # The runtime's dir: the upgraded agent turns Ready.
        helm.upgrade(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=agent_mod.node_values(real_cluster, agent_image),
        )
        agent_mod.ready_agent(node_core, real_cluster, image=agent_image)
        assert agent_http(real_cluster, "/readyz") == (200, "ready\n")
    finally:
        shutil.rmtree(wrong, ignore_errors=True)
