"""The plugin's log lines reach the agent's log (what `kubectl logs` of the agent pod shows),
tagged with the pod they are about."""

from __future__ import annotations

import pytest

from testbed.wait import wait_for
from tests.integration.conftest import MeshNode

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.chart]


def plugin_lines(log: str, pod_ref: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if "logger=agent.plugin" in line and "source=plugin" in line and f"pod={pod_ref}" in line
    ]


def test_plugin_log_lines_reach_the_agent_log_with_the_pod(mesh_node: MeshNode) -> None:
    pod = mesh_node.pod("default")
    ref = f"default/{pod['metadata']['name']}"
    sandbox = mesh_node.sandbox(pod)

    mesh_node.cni.add(sandbox)
    mesh_node.cni.delete(sandbox)

    wait_for(
        lambda: len(plugin_lines(mesh_node.agent.logs(), ref)) >= 2,
        f"plugin log lines about {ref} in the agent's log",
    )
    lines = plugin_lines(mesh_node.agent.logs(), ref)
    assert any('msg="ADD: redirected' in line for line in lines), lines
    assert any("DEL:" in line for line in lines), lines
    # One sandbox: every line names the same container id (the one the runtime passed).
    ids = {word for line in lines for word in line.split() if word.startswith("containerId=")}
    assert len(ids) == 1, lines
