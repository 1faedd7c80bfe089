"""`helm uninstall` on a real node: the garbage collector deletes the agent's pod with its
DaemonSet, kubelet stops it with SIGTERM, and the agent, seeing its DaemonSet going, removes its
entry and binaries: the node's CNI dirs are as before the install, and pods created afterwards
start without the plugin."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]


def listing(directory: Path) -> dict[str, str]:
    """name -> link target or size: what is in a CNI dir."""
    return {
        p.name: (str(p.readlink()) if p.is_symlink() else f"{p.stat().st_size} bytes")
        for p in sorted(directory.iterdir())
    }


def test_helm_uninstall_restores_the_node(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    primary = real_cluster.conflist_path
    conflist_before = primary.read_text()
    bins_before, confs_before = (
        listing(real_cluster.cni_bin_dir),
        listing(real_cluster.cni_conf_dir),
    )
    # The primary owned by its installer's user, not root: the agent's rewrites keep it so (the
    # chart gives it CAP_CHOWN for that), and so does the uninstall.
    was = primary.stat()
    os.chown(primary, 1234, 1234)
    primary.chmod(0o640)
    try:
        helm = node_helm("4")
        agent = agent_mod.install(helm, real_cluster, node_core, agent_image)
        agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
        assert (real_cluster.cni_bin_dir / "istio-cni").exists()
        installed = primary.stat()
        assert (installed.st_uid, installed.st_gid, stat.S_IMODE(installed.st_mode)) == (
            1234,
            1234,
            0o640,
        )

        helm.uninstall(agent_mod.RELEASE, namespace=agent_mod.AGENT_NAMESPACE)
        agent_mod.wait_agent_gone(node_core)
        after = primary.stat()
        assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (1234, 1234, 0o640)
    finally:
        os.chown(primary, was.st_uid, was.st_gid)
        primary.chmod(stat.S_IMODE(was.st_mode))
    # The pod object goes once kubelet reported its container stopped: the agent has exited.
    assert agent_mod.plugin_types(real_cluster) == ["bridge", "portmap"]
    assert real_cluster.conflist_path.read_text() == conflist_before
    assert listing(real_cluster.cni_bin_dir) == bins_before
    assert listing(real_cluster.cni_conf_dir) == confs_before
    assert agent.pod.name not in {p.metadata.name for p in agent_mod.agent_pods(node_core)}

    # A pod as the injector leaves it now starts without the plugin: no rules in its netns.
    image = real_cluster.images["workload"].ref
    node_core.create_namespaced_pod(
        workload_ns,
        kubepods.pod_manifest("after-uninstall", image, app_command=["sleep"], sidecar=True),
    )
    pod = kubepods.wait_running(node_core, workload_ns, "after-uninstall")
    assert not podnet.has_istio_rules(real_cluster.pod_netns(pod.uid))
