"""`istio-cni-agent install` / `uninstall` as real processes: exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess

from agent.install import conflist
from testbed.agent_host import Node, agent_command, agent_env

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command(*args),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_install_then_uninstall(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    config = node.write_config_yaml()
    done = _run("install", "--config", str(config))
    assert done.returncode == 0, done.stderr
    installed = node.conf("10-net.conflist")
    assert installed["plugins"][-1]["agent_pod_prefix"] == "istio-cni-node-"
    assert conflist.remove(installed) == LIST
    assert os.access(node.bin_dir / "istio-cni", os.X_OK)
    done = _run("uninstall", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert node.conf("10-net.conflist") == LIST
    assert os.listdir(node.bin_dir) == []
    assert _run("uninstall", "--config", str(config)).returncode == 0, "idempotent"


def test_install_times_out_without_primary(node: Node) -> None:
    config = node.write_config_yaml()
    done = _run("install", "--config", str(config), "--timeout", "0.3")
    assert done.returncode == 1
    assert f"waiting for a primary CNI config (.conf/.conflist/.json) in {node.conf_dir}" in (
        done.stderr
    )


def test_install_bad_primary_names_file(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text('{"name": "net", "plugins": {}}')
    config = node.write_config_yaml(cniConfFileName="10-net.conflist")
    done = _run("install", "--config", str(config))
    assert done.returncode == 1
    assert f"{node.conf_dir / '10-net.conflist'}: plugins must be a list" in done.stderr


def test_bad_config_file_named(node: Node) -> None:
    config = node.write_config_yaml(chained="yes")
    done = _run("install", "--config", str(config))
    assert done.returncode == 1
    assert f"{config}: key chained must be true or false" in done.stderr
