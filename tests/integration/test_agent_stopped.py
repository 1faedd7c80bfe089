"""The agent stopped for an upgrade (SIGTERM while its DaemonSet exists): the plugin and its
entry stay on the node, and the plugin fails closed: ADD of a pod that should be captured
fails with CNI code 11 ("try again later") instead of starting it uncaptured, while pods the
plugin decides about alone (excluded namespaces) still start."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from testbed.cni import Sandbox
from tests.integration.conftest import MeshNode, has_istio_rules

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.chart]

TRY_AGAIN_LATER = 11


def exec_plugin(node: MeshNode, sandbox: Sandbox, prev_result: dict[str, Any]) -> tuple[int, str]:
    """ADD exactly as the runtime calls our link of the chain: the installed binary, CNI_*
    env, the conflist's entry with cniVersion, name and the previous plugin's result on stdin."""
    conflist = json.loads(node.cni.conflist_path.read_text())
    conf = {
        **node.plugin_entry(),
        "cniVersion": conflist["cniVersion"],
        "name": conflist["name"],
        "prevResult": prev_result,
    }
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": sandbox.infra_container_id,
        "CNI_NETNS": str(sandbox.netns_path),
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": sandbox.cni_args(),
        "CNI_PATH": str(node.cni.bin_dir),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    done = subprocess.run(
        [str(node.plugin_binary)],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout


def test_stopped_agent_fails_sidecar_add_with_try_again_and_passes_excluded(
    mesh_node: MeshNode,
) -> None:
    assert mesh_node.agent.stop() == 0
    assert "keeping the plugin and its entry" in mesh_node.agent.logs()
    assert mesh_node.plugin_entry()["type"] == "istio-cni"
    assert mesh_node.plugin_binary.is_file()

    sidecar = mesh_node.sandbox(mesh_node.pod("default"))
    add = mesh_node.cnitool("ADD", sidecar)

    assert not add.ok
    assert "istio-cni agent is not reachable" in add.stderr
    assert not has_istio_rules(sidecar)
    # The CNI error object the runtime reads from the plugin's stdout.
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [{"address": "10.250.0.200/24", "interface": 0}],
    }
    code, stdout = exec_plugin(mesh_node, sidecar, prev)
    error = json.loads(stdout)
    assert code == 1
    assert error["code"] == TRY_AGAIN_LATER
    assert error["cniVersion"] == "1.0.0"
    assert error["msg"] == "istio-cni agent is not reachable"
    # The runtime tears the failed sandbox down: DEL passes without the agent.
    assert mesh_node.cnitool("DEL", sidecar).ok

    excluded = mesh_node.sandbox(mesh_node.pod("kube-system"))
    add = mesh_node.cnitool("ADD", excluded)
    assert add.ok, add.stderr
    assert add.json()["ips"]
    assert not has_istio_rules(excluded)
