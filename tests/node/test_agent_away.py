"""An agent outage on the real node (containerd) stops only the pods that need the agent: with
the agent stopped and its plugin and entry in place, a plain pod starts (containerd hands the
plugin the pod's annotations), a meshed pod waits and starts captured once the agent is back."""

from __future__ import annotations

from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed.images import Image
from testbed.realnode import RealCluster
from tests.node.agent_away import pods_while_agent_away

pytestmark = [pytest.mark.node]


def test_a_down_agent_stops_only_the_meshed_pods(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    pods_while_agent_away(
        real_cluster, node_core, workload_ns, agent_image, real_cluster.agent_run_dir
    )
