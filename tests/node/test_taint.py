"""`removeNotReadyTaint` on a real node: the node carries `cni.istio.io/not-ready=true:NoSchedule`
(as a node pool registers it so no pod lands before the CNI plugin is in place) and another
taint; the chart's agent (it tolerates every taint) installs itself, turns Ready, and takes only
its taint off, through the RBAC the chart grants for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent.node_taint import TAINT_KEY
from testbed import chart as agent_mod
from testbed import kubepods, nodetaint
from testbed.images import Image
from testbed.nodetaint import taints
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

OURS = nodetaint.NOT_READY
OTHER = {"key": "example.com/keep-me", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture
def tainted_node(real_cluster: RealCluster, node_core: Any) -> Iterator[str]:
    """The node with our taint and another one; both removed at the end, whatever happened."""
    with nodetaint.tainted(node_core, real_cluster.node_name, OURS, OTHER) as node:
        yield node


def test_agent_removes_only_its_taint_once_ready(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    tainted_node: str,
) -> None:
    keys = [(t["key"], t["effect"]) for t in taints(node_core, tainted_node)]
    assert (TAINT_KEY, "NoSchedule") in keys and (OTHER["key"], "NoSchedule") in keys

    # install() returns once kubelet reports the agent pod Running and Ready: its pod tolerates
    # the taints, and the taint may only go once the agent is ready.
    agent = agent_mod.install(
        node_helm("3"), real_cluster, node_core, agent_image, removeNotReadyTaint=True
    )
    started = time.monotonic()
    kubepods.wait_for(
        lambda: TAINT_KEY not in [t["key"] for t in taints(node_core, tainted_node)],
        "the agent to remove the not-ready taint",
        60,
        on_timeout=lambda: agent.logs(node_core)[-3000:],
    )
    removed_after = time.monotonic() - started

    after = taints(node_core, tainted_node)
    assert OTHER in [{k: t.get(k) for k in ("key", "value", "effect")} for t in after], after
    logs = agent.logs(node_core)
    assert "removed the not-ready taint from the node" in logs, logs[-3000:]
    # Only once ready: the install (plugin and entry in place) came first.
    assert 0 <= logs.find("install ready") < logs.find("removed the not-ready taint"), logs[-3000:]
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.status.container_statuses[0].restart_count == 0, logs[-3000:]
    print(f"taint removed {removed_after:.1f}s after the agent pod was Ready")
