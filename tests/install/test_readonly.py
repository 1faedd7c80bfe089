"""Read-only node directories (root: a read-only bind mount in a private mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from testbed.agent_host import Node, agent_command, agent_env

pytestmark = pytest.mark.netns  # needs root for mount namespaces and bind mounts

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


def _install_with_read_only(node: Node, read_only: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("read-only mount tests need root and util-linux unshare")
    config = node.write_config_yaml()
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    # The mount lives in a private mount namespace: it is gone when the process exits.
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            read_only,
            *agent_command("install", "--config", str(config)),
        ],
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_read_only_bin_dir_names_the_platform_preset(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    done = _install_with_read_only(node, str(node.bin_dir))
    assert done.returncode == 1
    assert f"write plugin {node.bin_dir / 'istio-cni'}: Read-only file system" in done.stderr
    assert "platform: gke" in done.stderr and "/home/kubernetes/bin" in done.stderr
    assert json.loads((node.conf_dir / "10-net.conflist").read_text()) == LIST
    assert os.listdir(node.bin_dir) == []


def test_read_only_conf_dir_loses_nothing(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    done = _install_with_read_only(node, str(node.conf_dir))
    assert done.returncode == 1
    assert f"CNI conf dir {node.conf_dir}" in done.stderr or (
        f"{node.conf_dir / '10-net.conflist'}: Read-only file system" in done.stderr
    )
    assert json.loads((node.conf_dir / "10-net.conflist").read_text()) == LIST
    assert os.listdir(node.conf_dir) == ["10-net.conflist"]
