"""A node restart with pods on it: kubelet and containerd stop, every container dies (a reboot),
both start again and kubelet starts every pod anew.

Two ways it goes, both for real:
- the node's conflist kept our entry: pods wait for the agent (the plugin fails closed) and start
  captured once it is back;
- the primary network's installer rewrote its conflist at boot (our entry gone) and the agent's
  image is slower to arrive than the pods start (here: it is off the node until the test brings it
  back): a sidecar pod starts uncaptured, and the agent, once Ready, finds and handles it by the
  chart's `repair.mode`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

OUTSIDE = "203.0.113.10"
LOOP = ["connect-loop", OUTSIDE, "80", "0.5"]
REPAIR_TIMEOUT = 60.0  # the agent's repair loop looks every 5 s


def new_sandbox(
    cluster: RealCluster, core: Any, ns: str, name: str, old_netns: str
) -> tuple[kubepods.PodView, str]:
    """The pod Running again in a sandbox other than `old_netns` (after the restart)."""

    def check() -> tuple[kubepods.PodView, str] | None:
        view = kubepods.pod_view(core, ns, name)
        if view is None or view.phase != "Running" or not view.ready:
            return None
        try:
            netns = cluster.pod_netns(view.uid)
        except AssertionError:
            return None
        return (view, netns) if netns != old_netns else None

    found: tuple[kubepods.PodView, str] = kubepods.wait_for(
        check,
        f"{ns}/{name} running in a new sandbox",
        120,
        interval=0.5,
        on_timeout=lambda: (
            f"{kubepods.pod_view(core, ns, name)}\n{kubepods.pod_events(core, ns, name)}"
        ),
    )
    return found


@pytest.fixture
def agent_image_back(real_cluster: RealCluster, agent_image: Image) -> Iterator[None]:
    """Whatever the test did with the agent's image, it is on the node again afterwards."""
    yield
    if agent_image.ref not in real_cluster.runtime_images():
        real_cluster.import_image(agent_image)


def bring_agent_back(cluster: RealCluster, core: Any, image: Image) -> agent_mod.Agent:
    """The agent's image arrives on the node; its pod, waiting in back-off for it, is replaced
    by the DaemonSet at once instead of after the back-off."""
    cluster.import_image(image)
    for pod in agent_mod.agent_pods(core):
        core.delete_namespaced_pod(
            pod.metadata.name, agent_mod.AGENT_NAMESPACE, grace_period_seconds=0
        )
    return agent_mod.ready_agent(core, cluster, image=image)


def test_after_restart_pods_wait_for_the_agent(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    agent_image_back: None,
    workload_ns: str,
) -> None:
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    image = real_cluster.images["workload"].ref
    node_core.create_namespaced_pod(
        workload_ns, kubepods.pod_manifest("before", image, app_command=LOOP, sidecar=True)
    )
    before = kubepods.wait_running(node_core, workload_ns, "before")
    old_netns = real_cluster.pod_netns(before.uid)

    real_cluster.restart_node(
        reboot=True, while_booting=lambda: real_cluster.remove_image(agent_image.ref)
    )
    # Without its agent the plugin refuses every ADD: the pod cannot start (for now).
    kubepods.wait_for(
        lambda: "istio-cni" in kubepods.pod_events(node_core, workload_ns, "before"),
        "the plugin's refusal in the pod's events",
        90,
        interval=1,
    )
    view = kubepods.pod_view(node_core, workload_ns, "before")
    assert view is not None and not view.ready, view

    bring_agent_back(real_cluster, node_core, agent_image)
    _, netns = new_sandbox(real_cluster, node_core, workload_ns, "before", old_netns)
    assert podnet.has_istio_rules(netns)
    line = kubepods.wait_log_line(
        node_core,
        workload_ns,
        "before",
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a captured connection",
    )
    assert f"original_dst={OUTSIDE}:80" in line
    app_log = kubepods.logs(node_core, workload_ns, "before", "app")
    assert not any(kubepods.escaped(s) for s in app_log.splitlines()), app_log[-1500:]


@pytest.mark.parametrize("mode", ["repair-in-place", "delete", "label"])
def test_pod_started_before_the_agent_is_repaired(
    mode: str,
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    agent_image_back: None,
    workload_ns: str,
) -> None:
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image, repair={"mode": mode})
    image = real_cluster.images["workload"].ref
    node_core.create_namespaced_pod(
        workload_ns, kubepods.pod_manifest("early", image, app_command=LOOP, sidecar=True)
    )
    first = kubepods.wait_running(node_core, workload_ns, "early")
    old_netns = real_cluster.pod_netns(first.uid)
    reference = real_cluster.reference_conflist()

    def boot() -> None:
        real_cluster.conflist_path.write_text(json.dumps(reference, indent=2) + "\n")
        real_cluster.remove_image(agent_image.ref)

    real_cluster.restart_node(reboot=True, while_booting=boot)
    # Started without the plugin: no rules, and its connections really leave the pod.
    early, netns = new_sandbox(real_cluster, node_core, workload_ns, "early", old_netns)
    assert not podnet.has_istio_rules(netns)
    kubepods.wait_log_line(
        node_core, workload_ns, "early", "app", kubepods.escaped, "a connection leaving the pod"
    )

    agent = bring_agent_back(real_cluster, node_core, agent_image)
    agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
    if mode == "repair-in-place":
        kubepods.wait_for(
            lambda: podnet.has_istio_rules(netns), "rules in the pod's netns", REPAIR_TIMEOUT
        )
        line = kubepods.wait_log_line(
            node_core,
            workload_ns,
            "early",
            "app",
            lambda s: "proxy-double port=15001" in s,
            "a connection captured after the repair",
        )
        assert f"original_dst={OUTSIDE}:80" in line
        view = kubepods.pod_view(node_core, workload_ns, "early")
        assert view is not None and view.uid == early.uid  # the same pod, in place
    elif mode == "delete":
        kubepods.wait_for(
            lambda: (
                (v := kubepods.pod_view(node_core, workload_ns, "early")) is None
                or v.uid != early.uid
            ),
            "the pod deleted",
            REPAIR_TIMEOUT,
        )
    else:

        def labelled() -> bool:
            pod = node_core.read_namespaced_pod("early", workload_ns)
            return (pod.metadata.labels or {}).get("cni.istio.io/uninitialized") == "true"

        kubepods.wait_for(labelled, "the pod labelled", REPAIR_TIMEOUT)
    logs = agent.logs(node_core)
    assert f"{workload_ns}/early" in logs and "without traffic redirect" in logs, logs[-3000:]
