"""containerd 2 as the node's runtime (testbed/containerd2.py), on kind's layout (kind's node image
runs containerd 2): beside the platforms tier's capture test on it (test_platforms.py,
`kind-on-containerd2`), an ambient pod enrolled through it, and the CNI STATUS verb.

containerd 2's CRI Status, which kubelet polls every 5 s, runs STATUS on each plugin of the
conflist it loaded when its cniVersion is 1.1.0 or later (go-cni's Status, libcni's
GetStatusNetworkList; older lists are never asked) and answers NetworkReady false on an error,
which kubelet turns into the Node's Ready false. Our plugin answers STATUS not ready while the
agent does not serve: with kindnet's conflist at 1.1.0 (plugins that speak it) and our plugin
chained into it, or in the Istio-owned copy (istioOwnedCNIConfig), the node turns NotReady while
the agent is away (stopped, its plugin and entry in place: tests/node/agent_away.py), naming the
plugin's reason, and Ready again once it is back.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods
from testbed.images import Image
from testbed.platforms import KIND_CNI_1_1, RUNTIME_VARIANTS
from testbed.realnode import RealCluster
from testbed.wait import wait_for
from tests.node.agent_away import agent_away
from tests.node.test_ambient import assert_a_pod_enrolled_with_ztunnel, set_mode_label
from tests.node.test_platforms import install_preset

pytestmark = [pytest.mark.node, pytest.mark.platforms]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
LOOP = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
OWNED = "02-istio-cni.conflist"  # the chart's istioOwnedCNIConfigFileName
NOT_AVAILABLE = "the plugin is not available"  # the plugin's STATUS error (CNI code 11)


@pytest.fixture(scope="module")
def layouts(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """The tests lay the node out on containerd 2; it ends as the test bed's own (1.6)."""
    try:
        yield real_cluster
    finally:
        real_cluster.relayout(None)


def test_ambient_pod_enrolled_on_containerd2(
    layouts: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    cluster = layouts
    cluster.relayout(RUNTIME_VARIANTS["kind-on-containerd2"])
    set_mode_label(node_core, workload_ns, "ambient")
    ambient = {"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)}
    install_preset(node_helm("4"), agent_image, "kind", "platform value", ambient=ambient)
    agent_mod.ready_agent(node_core, cluster, image=agent_image)

    assert_a_pod_enrolled_with_ztunnel(cluster, node_core, workload_ns, ztunnel_socket)


def ready_condition(core: Any, node: str) -> tuple[str, str]:
    """(status, message) of the Node's Ready condition."""
    conditions = core.read_node(node).status.conditions or []
    ready = next(c for c in conditions if c.type == "Ready")
    return str(ready.status), str(ready.message or "")


class ReadyWatch:
    """The Node's Ready condition and whether an agent pod is Ready, polled every 0.2 s in a
    thread: each change, timed (monotonic)."""

    def __init__(self, core: Any, node: str) -> None:
        self.core, self.node = core, node
        self.changes: list[tuple[float, str, bool]] = []
        """(when, "node" or "agent", Ready)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: dict[str, bool] = {}
        while not self._stop.is_set():
            try:
                now = {
                    "node": ready_condition(self.core, self.node)[0] == "True",
                    "agent": any(
                        kubepods.PodView.of(p).ready for p in agent_mod.agent_pods(self.core)
                    ),
                }
            except Exception:  # the API server busy: the next poll tells
                now = last
            for what, ready in now.items():
                if last.get(what) != ready:
                    self.changes.append((time.monotonic(), what, ready))
            last = now
            time.sleep(0.2)

    def first(self, what: str, ready: bool, since: float) -> float:
        """When `what` first turned `ready` after `since`."""
        return next(t for t, w, r in self.changes if t >= since and w == what and r == ready)

    def node_not_ready_since(self, since: float) -> bool:
        return any(t >= since and w == "node" and not r for t, w, r in self.changes)


def held_back(core: Any, namespace: str, name: str) -> str | None:
    """Why the pod does not start on a node whose network is not ready: the scheduler's refusal
    (the node's only taint then is not-ready) or kubelet's (NetworkNotReady), or None yet."""
    pod = core.read_namespaced_pod(name, namespace)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and "taint" in (c.message or ""):
            return str(c.message)
    events = kubepods.pod_events(core, namespace, name)
    return events if "NetworkNotReady" in events else None


def test_status_turns_the_node_not_ready_while_the_agent_is_away(
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    cluster = layouts
    platform = KIND_CNI_1_1
    cluster.relayout(platform)
    conf_dir = cluster.host_path(platform.conf_dir)
    helm = node_helm("4")
    image = cluster.images["workload"].ref
    for owned in (False, True):
        how = "owned copy" if owned else "chained"
        plain = f"plain-{owned:d}"
        with ReadyWatch(node_core, cluster.node_name) as watch:
            installed = time.monotonic()
            install_preset(helm, agent_image, "kind", "platform value", istioOwnedCNIConfig=owned)
            agent_mod.ready_agent(node_core, cluster, image=agent_image)
            # What containerd loads (the first file by name): 1.1.0, ours last.
            name = OWNED if owned else platform.conflist_name
            loaded = json.loads((conf_dir / name).read_text())
            assert loaded["cniVersion"] == "1.1.0", loaded
            assert [p["type"] for p in loaded["plugins"]] == ["ptp", "portmap", "istio-cni"]
            cluster.wait_node_ready(30)
            assert not watch.node_not_ready_since(installed), f"{how}: NotReady at install"

            stopping = time.monotonic()
            with agent_away(cluster, node_core, agent_image):

                def not_ready() -> str | None:
                    status, message = ready_condition(node_core, cluster.node_name)
                    return message if status == "False" else None

                message = wait_for(not_ready, f"{how}: the node NotReady", 60, interval=0.2)
                assert "NetworkReady=false" in message and "NetworkPluginNotReady" in message
                assert NOT_AVAILABLE in message, message
                # No pod starts on a node whose network is not ready, a plain one neither.
                node_core.create_namespaced_pod(
                    workload_ns,
                    kubepods.pod_manifest(plain, image, app_command=LOOP, sidecar=False),
                )
                wait_for(
                    functools.partial(held_back, node_core, workload_ns, plain),
                    f"{how}: the plain pod held back",
                    30,
                )
                view = kubepods.pod_view(node_core, workload_ns, plain)
                assert view is not None and view.phase == "Pending", view
            cluster.wait_node_ready(60)
            kubepods.wait_running(node_core, workload_ns, plain)
            uninstalled = time.monotonic()
            agent_mod.uninstall(helm, node_core)
            cluster.wait_node_ready(30)
            assert not watch.node_not_ready_since(uninstalled), f"{how}: NotReady at uninstall"
        agent_down = watch.first("agent", False, stopping)
        node_down = watch.first("node", False, stopping)
        # The plugin answers STATUS ready once the agent serves, which may be before its pod's
        # readiness probe passes: the node may be Ready first (a negative time).
        agent_up = watch.first("agent", True, node_down)
        node_up = watch.first("node", True, node_down)
        times = {
            "image_patch_to_node_not_ready_s": node_down - stopping,
            "agent_not_ready_to_node_not_ready_s": node_down - agent_down,
            "agent_ready_to_node_ready_s": node_up - agent_up,
        }
        print(f"{how}: { ({k: round(v, 1) for k, v in times.items()}) }")
        kubepods.delete_and_wait(node_core, workload_ns, plain)
