"""A live node moved between Istio's own node agent (testbed/istio_agent.py) and ours by the
procedure README "Migrating from Istio's CNI on a live cluster" gives:

    1. taint the node `cni.istio.io/not-ready=true:NoSchedule` (new pods wait unscheduled)
    2. wait until no pod on the node is still starting (its sandbox being made)
    3. `helm uninstall` the agent leaving (it takes its plugin and conflist entry away)
    4. `helm install` the agent coming in; the taint goes once it is Ready (ours with
       `removeNotReadyTaint: true`; for Istio's, istiod's untaint controller or by hand)

    istio_to_ours()   the move to ours
    ours_to_istio()   the way back
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from testbed import chart as agent_mod
from testbed import istio_agent, kubepods, nodetaint
from testbed.helm import Helm
from testbed.images import Image
from testbed.realnode import RealCluster

# Repair off on both sides: a pod that starts uncaptured must stay visible as such, not be
# repaired a moment later.
ISTIO_VALUES: dict[str, Any] = {"repair": {"enabled": False}}
OUR_VALUES: dict[str, Any] = {"repair": {"enabled": False}, "removeNotReadyTaint": True}
TAINT = nodetaint.NOT_READY["key"]


def wait_nothing_starting(core: Any, node: str) -> None:
    """Step 2: no pod bound to the node is Pending (its sandbox may be being made now, through
    the conflist the next step changes)."""

    def starting() -> list[str]:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        return [p.metadata.name for p in pods if p.status.phase == "Pending"]

    kubepods.wait_for(
        lambda: not starting(),
        "no pod on the node still starting",
        120,
        on_timeout=lambda: f"still starting: {starting()}",
    )


def cut_over(
    core: Any, node: str, leave: Callable[[], None], come: Callable[[], None]
) -> tuple[float, float]:
    """Steps 1-4: taint, wait for starting pods, `leave` (uninstall and wait the agent away),
    `come` (install, and the taint gone); (tainted at, untainted at) on the monotonic clock."""
    nodetaint.add(core, node, nodetaint.NOT_READY)
    tainted = time.monotonic()
    wait_nothing_starting(core, node)
    leave()
    come()
    assert TAINT not in nodetaint.keys(nodetaint.taints(core, node))
    return tainted, time.monotonic()


def istio_to_ours(
    helm: Helm, cluster: RealCluster, core: Any, agent_image: Image
) -> tuple[float, float]:
    """The move to ours: our agent removes the taint once Ready."""

    def leave() -> None:
        istio_agent.uninstall(helm, core)

    def come() -> None:
        agent_mod.install(helm, cluster, core, agent_image, **OUR_VALUES)
        kubepods.wait_for(
            lambda: TAINT not in nodetaint.keys(nodetaint.taints(core, cluster.node_name)),
            "our agent to remove the not-ready taint",
            60,
        )

    return cut_over(core, cluster.node_name, leave, come)


def ours_to_istio(
    helm: Helm, cluster: RealCluster, core: Any, istio_image: Image
) -> tuple[float, float]:
    """The way back; here no istiod runs, so the taint goes by hand once Istio's pod is Ready."""

    def leave() -> None:
        agent_mod.uninstall(helm, core)

    def come() -> None:
        istio_agent.install(helm, cluster, core, istio_image, **ISTIO_VALUES)
        nodetaint.remove(core, cluster.node_name, TAINT)

    return cut_over(core, cluster.node_name, leave, come)
