"""The agent stopped on the real node, its plugin and entry left in place: which pods start.

The agent is stopped as a rollout it cannot finish stops it: its DaemonSet's image set to one the
node does not have (`pullPolicy: Never`). Its pod gets SIGTERM and keeps its install (its
DaemonSet still exists and selects the node), the new pod never starts. While it is away a plain
pod (no Istio annotation) starts, and a meshed pod (the injector's `sidecar.istio.io/status`, an
`istio-proxy` container) waits, its sandbox refused by the plugin, no container started. Once
the agent is back the meshed pod starts, captured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

OUTSIDE = "203.0.113.10"  # TEST-NET-3: never routed; the node netns has no route out
LOOP = ["connect-loop", OUTSIDE, "80", "0.5"]
PASSED = "ADD passes a plain pod without the agent"  # the plugin's log line


def _daemonset(cluster: RealCluster) -> Any:
    sets = cluster.apps().list_namespaced_daemon_set(
        agent_mod.AGENT_NAMESPACE, label_selector=agent_mod.AGENT_SELECTOR
    )
    assert len(sets.items) == 1, [d.metadata.name for d in sets.items]
    return sets.items[0]


def _set_image(cluster: RealCluster, name: str, image: str) -> None:
    patch = {"spec": {"template": {"spec": {"containers": [
        {"name": agent_mod.AGENT_CONTAINER, "image": image}
    ]}}}}  # fmt: skip
    cluster.apps().patch_namespaced_daemon_set(name, agent_mod.AGENT_NAMESPACE, patch)


@contextlib.contextmanager
def agent_away(cluster: RealCluster, core: Any, image: Image) -> Iterator[None]:
    """The agent's pod gone and none able to start; on exit the image set back and the agent
    Ready again (also when the test failed)."""
    name = _daemonset(cluster).metadata.name
    absent = f"{image.hub}/istio-cni:absent-from-the-node"
    _set_image(cluster, name, absent)
    try:
        kubepods.wait_for(
            lambda: all(p.spec.containers[0].image == absent for p in agent_mod.agent_pods(core)),
            "the agent's pod gone (its replacement cannot start)",
            90,
            interval=0.5,
        )
        yield
    finally:
        _set_image(cluster, name, image.ref)
        agent_mod.ready_agent(core, cluster, image=image)


def refused_by_the_plugin(core: Any, namespace: str, name: str) -> bool:
    return "istio-cni" in kubepods.pod_events(core, namespace, name)


def pods_while_agent_away(
    cluster: RealCluster, core: Any, namespace: str, image: Image, run_dir: Path
) -> None:
    """With the chart installed (sidecar only) and its agent Ready: the plain pod starts
    uncaptured while the agent is away, the meshed one waits and starts captured after."""
    workload = cluster.images["workload"].ref
    with agent_away(cluster, core, image):
        for pod, sidecar in (("plain", False), ("meshed", True)):
            core.create_namespaced_pod(
                namespace, kubepods.pod_manifest(pod, workload, app_command=LOOP, sidecar=sidecar)
            )
        plain = kubepods.wait_running(core, namespace, "plain")
        assert not podnet.has_istio_rules(cluster.pod_netns(plain.uid))
        log = (run_dir / "istio-cni.log").read_text()
        assert PASSED in log and f"{namespace}/plain" in log, log[-2000:]
        kubepods.wait_for(
            lambda: refused_by_the_plugin(core, namespace, "meshed"),
            "the plugin's refusal in the meshed pod's events",
            60,
            interval=0.5,
        )
        view = kubepods.pod_view(core, namespace, "meshed")
        assert view is not None and view.phase == "Pending", view
        assert not any("running" in c["state"] for c in view.containers.values()), view
    meshed = kubepods.wait_running(core, namespace, "meshed")
    assert podnet.has_istio_rules(cluster.pod_netns(meshed.uid))
    line = kubepods.wait_log_line(
        core,
        namespace,
        "meshed",
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a captured connection",
    )
    assert f"original_dst={OUTSIDE}:80" in line, line
