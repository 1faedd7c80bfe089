"""`helm install` on a real node (Helm 3 and Helm 4): the DaemonSet controller makes the agent's
pod, kube-scheduler places it, kubelet runs the chart's pod spec with containerd from the image
built here (pullPolicy Never: nothing is pulled), and the readiness probe passes. The agent puts
the plugin into the runtime's CNI bin dir and chains itself last into the runtime's conflist."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]


@pytest.mark.parametrize("major", ["3", "4"])
def test_helm_install_runs_the_agent_on_the_node(
    major: str,
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
) -> None:
    reference = agent_mod.conflist(real_cluster)
    helm = node_helm(major)
    agent = agent_mod.install(helm, real_cluster, node_core, agent_image)

    # The DaemonSet's pod, on this node, from the image built here, started once.
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.metadata.owner_references[0].kind == "DaemonSet"
    status = pod.status.container_statuses[0]
    assert status.image == agent_image.ref
    assert status.restart_count == 0, agent.logs(node_core)

    # The plugin in the runtime's bin dir, our entry last in its conflist, the rest unchanged.
    plugin = real_cluster.cni_bin_dir / "istio-cni"
    assert plugin.is_file() and os.access(plugin, os.X_OK)
    agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
    conf = agent_mod.conflist(real_cluster)
    assert conf["plugins"][:-1] == reference["plugins"]
    assert conf["plugins"][-1]["type"] == "istio-cni"
    # containerd runs the chain from this file: the only one in its conf dir.
    assert sorted(p.name for p in real_cluster.cni_conf_dir.iterdir()) == [
        real_cluster.conflist_path.name
    ]

    # What kubelet gave the container, as the runtime holds it: the chart's security context.
    spec, pid = real_cluster.container(pod.metadata.uid, agent_mod.AGENT_CONTAINER)
    assert spec["root"]["readonly"] is True
    caps = set(spec["process"]["capabilities"]["effective"])
    assert caps == {
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_SYS_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_DAC_OVERRIDE",
        "CAP_CHOWN",
    }, caps
    assert spec["process"]["user"]["uid"] == 0
    # hostNetwork: the process is in the node's netns.
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(real_cluster.network.netns_path).st_ino
    env = dict(e.split("=", 1) for e in spec["process"]["env"])
    assert env["NODE_NAME"] == real_cluster.node_name
    assert env["POD_NAME"] == agent.pod.name
    assert env["POD_NAMESPACE"] == agent_mod.AGENT_NAMESPACE
    # In-cluster config: the `kubernetes` Service, reached through the node (kube-proxy's DNAT).
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    assert mounts[str(real_cluster.netns_dir)]["options"].count("rslave") == 1, json.dumps(
        mounts[str(real_cluster.netns_dir)]
    )

    logs = agent.logs(node_core)
    assert "in-cluster service account" in logs, logs[-3000:]
