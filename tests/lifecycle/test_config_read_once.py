"""config.yaml is read once, at start (agent/lifecycle.py): a ConfigMap change reaches a node only
when the DaemonSet's rolling update replaces its pod (the chart's `checksum/config` annotation),
never by a running agent picking it up, so a wrong value stops at the nodes the rollout reached."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import yaml

from agent.install import conflist
from testbed.agent_host import Node, agent_command, http_get, running_agent, wait_installed
from testbed.ports import free_port

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


def replace_config(path: pathlib.Path, **changes: Any) -> None:
    """Change keys of config.yaml in one rename, as a ConfigMap update lands."""
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(yaml.safe_dump(data))
    os.replace(tmp, path)


def excluded_in_entry(node: Node) -> list[str]:
    plugins = node.conf("10-net.conflist")["plugins"]
    ours = [p for p in plugins if conflist.is_ours(p)]
    assert len(ours) == 1, plugins
    return list(ours[0].get("exclude_namespaces", []))


def test_a_changed_config_waits_for_the_next_pod(node: Node) -> None:
    node.write_primary(LIST)
    port = free_port()
    config = node.write_config_yaml(metricsPort=port, excludeNamespaces=["kube-system"])
    with running_agent(agent_command("run", "--config", str(config))) as agent:
        wait_installed(port)
        replace_config(config, metricsPort=free_port(), excludeNamespaces=["kube-system", "b"])
        time.sleep(3)  # a live reload acted within a second of the rename
        assert excluded_in_entry(node) == ["kube-system"]
        assert http_get(port, "/healthz")[0] == 200  # the port read at start still serves
        assert agent.proc.poll() is None, agent.log.read_text()
        code, log = agent.stop()
    assert code == 0, log
    assert "config file changed" not in log
    # The next agent (the pod the rollout starts) reads the new file.
    with running_agent(agent_command("run", "--config", str(config))) as agent:
        wait_installed(yaml.safe_load(config.read_text())["metricsPort"])
        assert excluded_in_entry(node) == ["kube-system", "b"]
        code, log = agent.stop()
    assert code == 0, log
