"""A neighbour that adds a victim pod's IP to its own network namespace (what NET_ADMIN lets a pod
do; here the test adds it from the node, to the same effect) cannot take the victim's place on the
real node: the agent finds each pod's namespace by the pod's identity (its processes' cgroups name
the pod's UID), never by the IP.

- ambient: after an agent restart (nothing recorded from the pods' ADDs any more), a namespace
  labelled ambient enrolls both pods live, and the ztunnel TEST DOUBLE (testbed/ztunnel_double.py)
  receives for each pod a descriptor of that pod's own namespace; after another restart ztunnel's
  snapshot names the victim with its own namespace again. The conflict is logged.
- repair: a sidecar pod that started before the agent is repaired in its own namespace; the
  neighbour's namespace, holding the same IP, gets no rules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster
from testbed.ztunnel_double import Workload, ZtunnelDouble, api_identity

pytestmark = [pytest.mark.node, pytest.mark.hostile]

MODE_LABEL = "istio.io/dataplane-mode"
ANNOTATION = "ambient.istio.io/redirection"
CONFLICT = "another network namespace holds the pod's IP"
OUTSIDE = "203.0.113.10"
REPAIR_TIMEOUT = 60.0


def start_pod(core: Any, cluster: RealCluster, ns: str, name: str, *, sidecar: bool) -> Any:
    manifest = kubepods.pod_manifest(
        name,
        cluster.images["workload"].ref,
        app_command=["connect-loop", OUTSIDE, "80", "1"],
        sidecar=sidecar,
    )
    core.create_namespaced_pod(ns, manifest)
    return kubepods.wait_running(core, ns, name)


def take_address(netns: str, ip: str) -> None:
    """The neighbour's namespace now holds `ip` too."""
    podnet.in_netns(netns, "ip", "addr", "add", f"{ip}/32", "dev", "eth0")
    assert ip in podnet.in_netns(netns, "ip", "-4", "addr", "show", "dev", "eth0")


def restart_agent(core: Any, cluster: RealCluster, old: agent_mod.Agent) -> agent_mod.Agent:
    """Delete the agent's pod: the DaemonSet makes a new one, which knows nothing of the old."""
    core.delete_namespaced_pod(old.pod.name, agent_mod.AGENT_NAMESPACE)
    new = agent_mod.ready_agent(core, cluster)
    assert new.pod.name != old.pod.name
    return new


def both_of(z: ZtunnelDouble, *pods: Any) -> dict[str, Workload] | None:
    """ztunnel's workloads once every pod is among them."""
    held = z.workloads()
    return held if all(p.uid in held for p in pods) else None


def annotation(core: Any, ns: str, name: str) -> str | None:
    value: str | None = (core.read_namespaced_pod(name, ns).metadata.annotations or {}).get(
        ANNOTATION
    )
    return value


def test_ambient_binds_each_pod_to_its_own_namespace(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    agent = agent_mod.install(
        node_helm("4"),
        real_cluster,
        node_core,
        agent_image,
        ambient={"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)},
    )
    victim = start_pod(node_core, real_cluster, workload_ns, "victim", sidecar=False)
    neighbour = start_pod(node_core, real_cluster, workload_ns, "neighbour", sidecar=False)
    victim_ns, neighbour_ns = (real_cluster.pod_netns(p.uid) for p in (victim, neighbour))
    take_address(neighbour_ns, victim.ip)
    agent = restart_agent(node_core, real_cluster, agent)

    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(node_core)) as ztunnel:
        ztunnel.connect()
        ztunnel.wait_for("the agent's first snapshot", lambda z: z.snapshots >= 1)
        node_core.patch_namespace(workload_ns, {"metadata": {"labels": {MODE_LABEL: "ambient"}}})
        kubepods.wait_for(
            lambda: (
                annotation(node_core, workload_ns, "victim") == "enabled"
                and annotation(node_core, workload_ns, "neighbour") == "enabled"
            ),
            "both pods enrolled",
            60,
            on_timeout=lambda: agent.logs(node_core)[-3000:],
        )
        both = ztunnel.wait_for("AddWorkload of both pods", lambda z: both_of(z, victim, neighbour))
        assert both is not None
        assert both[victim.uid].netns_inode == os.stat(victim_ns).st_ino, (
            "ztunnel got another namespace as the victim's"
        )
        assert both[neighbour.uid].netns_inode == os.stat(neighbour_ns).st_ino
        logs = agent.logs(node_core)
        assert any(CONFLICT in line and "victim" in line for line in logs.splitlines()), logs[
            -3000:
        ]

        # Another restart: ztunnel's first snapshot is rebuilt from what the node shows.
        agent = restart_agent(node_core, real_cluster, agent)
        ztunnel.restart()
        again = ztunnel.wait_for(
            "a snapshot naming both pods", lambda z: both_of(z, victim, neighbour), timeout=30
        )
        assert again is not None
        assert again[victim.uid].netns_inode == os.stat(victim_ns).st_ino
        assert again[neighbour.uid].netns_inode == os.stat(neighbour_ns).st_ino


def test_repair_programs_the_victims_own_namespace(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    # Both start before the agent is on the node: the victim's sidecar pod runs uncaptured.
    victim = start_pod(node_core, real_cluster, workload_ns, "victim", sidecar=True)
    neighbour = start_pod(node_core, real_cluster, workload_ns, "neighbour", sidecar=False)
    victim_ns, neighbour_ns = (real_cluster.pod_netns(p.uid) for p in (victim, neighbour))
    assert not podnet.has_istio_rules(victim_ns)
    take_address(neighbour_ns, victim.ip)

    agent = agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    kubepods.wait_for(
        lambda: podnet.has_istio_rules(victim_ns),
        "repair to program the victim's namespace",
        REPAIR_TIMEOUT,
        on_timeout=lambda: agent.logs(node_core)[-3000:],
    )
    assert not podnet.has_istio_rules(neighbour_ns), podnet.saved_rules(neighbour_ns)
    events = node_core.list_namespaced_event(
        workload_ns, field_selector=f"involvedObject.uid={victim.uid}"
    ).items
    assert [e.reason for e in events if e.reason == "RepairBrokenPod"], [e.reason for e in events]
    assert any(CONFLICT in line and "victim" in line for line in agent.logs(node_core).splitlines())
