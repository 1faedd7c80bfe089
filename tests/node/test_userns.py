"""User-namespaced pods (`hostUsers: false`) on the containerd 2 node (kind's layout): a sidecar
pod that istiod injects is captured from its first connection and Istio's own validation
(`istio-validation`, pilot-agent's `istio-iptables --run-validation`) passes in it; an ambient
pod is enrolled with the ztunnel double and its connection answered there.

Such a pod needs kubelet's UserNamespacesSupport (on by default in 1.35), containerd 2 (whose
sandbox netns is made inside the pod's user namespace, so the namespace is owned by it) and an
OCI runtime with idmapped mounts (runc 1.2 or later: ci/setup-testbed builds 1.5.2; Debian's 1.1
refuses the pod), and containerd's state dir on a path that pod's root may walk (runc's init
looks the rootfs mount point up by path as that root, which maps no uid of the machine: the test
bed keeps it outside pytest's 0700 dirs, nodeclean.NodeRecord.traversable_dir). Each test
checks that the pod's processes really run in a user namespace of their own (their uid_map is
not the identity of the machine's).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.injected import (
    assert_inbound_captured,
    assert_outbound_captured,
    assert_validation_passed,
    connect_loop,
    deployment,
    injected_namespace,
    wait_deployment_pod,
    wait_injected_running,
)
from testbed.istiod import Istiod
from testbed.platforms import RUNTIME_VARIANTS
from testbed.realnode import RealCluster
from testbed.ztunnel_double import OUTBOUND_PORT, ZtunnelDouble, api_identity
from tests.node.test_ambient import ambient_chains, annotation, set_mode_label
from tests.node.test_platforms import install_preset

pytestmark = [pytest.mark.node, pytest.mark.platforms, pytest.mark.istiod]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
LOOP = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
HOST_IDENTITY = ["0", "0", "4294967295"]
"""The uid_map of a process in the machine's own user namespace."""


@pytest.fixture(scope="module")
def userns_node(real_cluster: RealCluster, istiod: Istiod) -> Iterator[RealCluster]:
    """The node on containerd 2 in kind's layout for the module; it ends as the test bed's own.
    istiod first: its proxy image goes into containerd 1.6, which runs only in the test bed's
    own layout, and containerd 2 takes every image of the node when it starts."""
    start = time.monotonic()
    real_cluster.relayout(RUNTIME_VARIANTS["kind-on-containerd2"])
    print(f"relayout to kind-on-containerd2: {time.monotonic() - start:.1f} s")
    try:
        yield real_cluster
    finally:
        real_cluster.relayout(None)


@pytest.fixture
def timed() -> Iterator[None]:
    start = time.monotonic()
    yield
    print(f"wall time: {time.monotonic() - start:.1f} s")


def assert_in_user_namespace(cluster: RealCluster, pod_uid: str, container: str) -> None:
    """The container's process runs in a user namespace of its own: a uid map other than the
    machine's identity, 0 inside mapped to an unprivileged range outside; so does its OCI spec."""
    spec, pid = cluster.container(pod_uid, container)
    namespaces = [n["type"] for n in spec["linux"]["namespaces"]]
    assert "user" in namespaces, namespaces
    assert spec["linux"].get("uidMappings"), spec["linux"]
    uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
    assert uid_map != HOST_IDENTITY, uid_map
    inside, outside, length = (int(x) for x in uid_map[:3])
    assert inside == 0 and outside >= 65536 and length == 65536, uid_map
    host_userns = os.stat("/proc/self/ns/user").st_ino
    assert os.stat(f"/proc/{pid}/ns/user").st_ino != host_userns


def userns_deployment(name: str, image: str) -> dict[str, Any]:
    manifest = deployment(name, image, connect_loop())
    manifest["spec"]["template"]["spec"]["hostUsers"] = False
    return manifest


def test_sidecar_pod_without_host_users_captured_and_validated(
    userns_node: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
    timed: None,
) -> None:
    cluster = userns_node
    install_preset(node_helm("4"), agent_image, "kind", "platform value")
    agent = agent_mod.ready_agent(node_core, cluster, image=agent_image)
    with injected_namespace(node_core, cluster.apps(), istiod) as namespace:
        manifest = userns_deployment("web", cluster.images["workload"].ref)
        cluster.apps().create_namespaced_deployment(namespace, manifest)
        pod = wait_deployment_pod(node_core, namespace, "app=web", istiod)
        view = wait_injected_running(node_core, namespace, pod)
        pod = node_core.read_namespaced_pod(view.name, namespace)
        assert pod.spec.host_users is False, pod.spec
        assert_in_user_namespace(cluster, view.uid, "app")

        assert_validation_passed(node_core, namespace, pod)
        assert_outbound_captured(node_core, namespace, pod)
        # From its first connection: none left the pod before the rules were in.
        app_log = kubepods.logs(node_core, namespace, view.name, "app")
        assert not any(kubepods.escaped(s) for s in app_log.splitlines()), app_log[-2000:]
        assert view.ip
        assert_inbound_captured(cluster.network.netns_path, pod)
        assert podnet.has_istio_rules(cluster.pod_netns(view.uid))
        logs = agent.logs(node_core)
        assert any(
            "source=plugin" in s and f"pod={namespace}/{view.name}" in s for s in logs.splitlines()
        ), logs[-4000:]


def test_ambient_pod_without_host_users_enrolled(
    userns_node: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    timed: None,
) -> None:
    cluster = userns_node
    set_mode_label(node_core, workload_ns, "ambient")
    ambient = {"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)}
    install_preset(node_helm("4"), agent_image, "kind", "platform value", ambient=ambient)
    agent_mod.ready_agent(node_core, cluster, image=agent_image)

    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(node_core)) as ztunnel:
        ztunnel.connect()
        ztunnel.wait_for("the agent's first (empty) snapshot", lambda z: z.snapshots >= 1)
        manifest = kubepods.pod_manifest(
            "web", cluster.images["workload"].ref, app_command=LOOP, sidecar=False
        )
        manifest["spec"]["hostUsers"] = False
        node_core.create_namespaced_pod(workload_ns, manifest)
        pod = kubepods.wait_running(node_core, workload_ns, "web")
        assert_in_user_namespace(cluster, pod.uid, "app")
        netns = cluster.pod_netns(pod.uid)
        assert annotation(node_core, workload_ns, "web") == "enabled"
        workload = ztunnel.workloads().get(pod.uid)
        assert workload is not None, ztunnel.requests
        assert workload.netns_inode == os.stat(netns).st_ino
        assert ambient_chains(netns), podnet.saved_rules(netns)
        line = kubepods.wait_log_line(
            node_core,
            workload_ns,
            "web",
            "app",
            lambda s: f"ztunnel-double|{pod.uid}|{OUTBOUND_PORT}" in s,
            "a connection answered by the ztunnel double",
        )
        assert f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
