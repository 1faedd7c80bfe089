"""`istio-cni-agent run` as a real process: readiness, healing, SIGTERM uninstall vs upgrade."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agent.install import conflist
from testbed.agent_host import (
    Node,
    agent_command,
    agent_env,
    http_get,
    running_agent,
    wait_installed,
    wait_status,
)
from testbed.ports import free_port
from testbed.wait import wait_for

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}
NODE = {"metadata": {"name": "node-1", "labels": {"pool": "a"}}}


def _readyz(port: int) -> str:
    try:
        return http_get(port, "/readyz")[1]
    except OSError:  # not listening yet
        return ""


def _has_entry(node: Node) -> bool:
    try:
        return conflist.count_ours(node.conf("10-net.conflist")) == 1
    except (OSError, ValueError):
        return False


@pytest.mark.parametrize(("mode", "kept"), [("always", False), ("never", True)])
def test_run_ready_heals_and_stops(node: Node, mode: str, kept: bool) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    port = free_port()
    config = node.write_config_yaml(metricsPort=port, uninstallOnStop=mode)
    with running_agent(agent_command("run", "--config", str(config))) as proc:
        wait_installed(port)
        # Installed and serving, yet not Ready: this host process's API server cannot be
        # reached, so no ADD could look its pod up (the readiness tiers reach one).
        body = wait_status(port, "/readyz", 503)
        assert body.startswith("not ready: api") and "\napi: the pod cache has not listed" in body
        assert "install" not in body.splitlines()[0], body
        assert http_get(port, "/healthz")[0] == 200
        assert "istio_cni_install_ready 1.0" in http_get(port, "/metrics")[1]
        (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))  # entry dropped
        wait_for(lambda: _has_entry(node), "the dropped entry to be put back", 5)
        wait_installed(port)
        metrics = http_get(port, "/metrics")[1]
        assert 'istio_cni_install_heals_total{kind="config"} 1.0' in metrics
        code, err = proc.stop()
    assert code == 0, err
    assert _has_entry(node) is kept
    assert (node.bin_dir / "istio-cni").exists() is kept
    if not kept:
        assert node.conf("10-net.conflist") == LIST


def test_named_primary_survives_uninstall_after_a_restart(node: Node) -> None:
    """cniConfFileName names the node's primary: an agent that restarts, finds its entry in
    place, then uninstalls on SIGTERM takes the entry out and leaves the file byte for byte."""
    original = json.dumps(LIST, indent="\t").encode()
    (node.conf_dir / "10-net.conflist").write_bytes(original)
    for mode in ("never", "always"):  # an upgrade's stop, then the restarted agent's removal
        port = free_port()
        config = node.write_config_yaml(
            metricsPort=port, uninstallOnStop=mode, cniConfFileName="10-net.conflist"
        )
        with running_agent(agent_command("run", "--config", str(config))) as proc:
            wait_installed(port)
            assert _has_entry(node)
            code, err = proc.stop()
        assert code == 0, err
    assert os.listdir(node.conf_dir) == ["10-net.conflist"]
    assert (node.conf_dir / "10-net.conflist").read_bytes() == original
    assert not (node.bin_dir / "istio-cni").exists()


def test_not_ready_until_primary_appears(node: Node) -> None:
    port = free_port()
    config = node.write_config_yaml(metricsPort=port, uninstallOnStop="always")
    with running_agent(agent_command("run", "--config", str(config))) as proc:
        body = wait_status(port, "/readyz", 503)
        assert body.startswith("not ready: install"), body
        assert "\ninstall: " in body  # what is missing, from the installer
        assert http_get(port, "/healthz")[0] == 200
        (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
        wait_installed(port)
        code, err = proc.stop()
    assert code == 0, err
    assert node.conf("10-net.conflist") == LIST


def test_a_wrong_netns_dir_keeps_it_not_ready_naming_the_value(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    port = free_port()
    wrong = node.root / "var-run-netns-typo"
    config = node.write_config_yaml(metricsPort=port, cniNetnsDir=str(wrong))
    with running_agent(agent_command("run", "--config", str(config))) as proc:
        wait_installed(port)
        for _ in range(20):  # probes do not log
            body = wait_status(port, "/readyz", 503)
        assert f"\nnetns-dir: cniNetnsDir {wrong} is not a directory" in body, body
        metrics = http_get(port, "/metrics")[1]
        assert 'istio_cni_ready_check{check="netns-dir"} 0.0' in metrics
        assert 'istio_cni_ready_check{check="install"} 1.0' in metrics
        code, log = proc.stop()
    assert code == 0, log
    failed = [line for line in log.splitlines() if "readiness check fails" in line]
    assert [line for line in failed if "check=netns-dir" in line and str(wrong) in line], log
    assert sum("check=netns-dir" in line for line in failed) == 1, failed


def test_start_error_exits_nonzero_with_message(node: Node) -> None:
    real = node.root / "elsewhere.conflist"
    real.write_text(json.dumps(LIST))
    (node.conf_dir / "10-net.conflist").symlink_to(real)
    config = node.write_config_yaml(metricsPort=free_port())
    done = subprocess.run(
        agent_command("run", "--config", str(config)),
        env=agent_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "10-net.conflist: is a symlink" in done.stderr


def test_port_in_use_exits_nonzero(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        config = node.write_config_yaml(metricsPort=busy.getsockname()[1])
        done = subprocess.run(
            agent_command("run", "--config", str(config)),
            env=agent_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "cannot start HttpServer" in done.stderr


def _ds(**metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "istio-cni-node", **metadata},
        "spec": {"template": {"spec": {"nodeSelector": {"pool": "a"}}}},
    }


@pytest.mark.parametrize(
    ("state", "kept"),
    [
        ({"daemonset": None, "node": NODE}, False),
        ({"daemonset": _ds(deletionTimestamp="2026-11-30T00:00:00Z"), "node": NODE}, False),
        (
            {"daemonset": _ds(), "node": {"metadata": {"name": "node-1", "labels": {"pool": "b"}}}},
            False,
        ),
        ({"daemonset": _ds(), "node": NODE}, True),
        ({"error": "connection refused"}, True),
    ],
    ids=["ds-gone", "ds-deleting", "node-no-longer-selected", "upgrade", "api-unreachable"],
)
def test_sigterm_decides_from_daemonset_state(
    node: Node, state: dict[str, Any], kept: bool
) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    port = free_port()
    config = node.write_config_yaml(metricsPort=port, uninstallOnStop="auto")
    (node.root / "state.json").write_text(json.dumps(state))
    command = [
        sys.executable,
        "-m",
        "tests.install.given_state_agent",
        str(config),
        str(node.root / "state.json"),
    ]
    with running_agent(command) as proc:
        wait_installed(port)
        code, err = proc.stop()
    assert code == 0, err
    assert _has_entry(node) is kept
    assert os.path.exists(node.bin_dir / "istio-cni") is kept


def test_a_conf_dir_deleted_on_the_node_makes_it_not_live(node: Node) -> None:
    """The node's conf dir deleted and created again (a CNI reinstall): a hostPath mount keeps
    showing the deleted directory. Stood in for by /proc/PID/fd/N, which, like the mount, keeps
    resolving to the directory this process holds open. The agent is then neither Ready nor
    live (kubelet restarts the container, which mounts the new directory), and says why."""
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    held = os.open(node.conf_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mounted = f"/proc/{os.getpid()}/fd/{held}"
        port = free_port()
        config = node.write_config_yaml(metricsPort=port, mountedCniConfDir=mounted)
        with running_agent(agent_command("run", "--config", str(config))) as proc:
            wait_installed(port)
            assert http_get(port, "/healthz")[0] == 200
            for name in os.listdir(node.conf_dir):
                os.unlink(node.conf_dir / name)
            os.rmdir(node.conf_dir)
            node.conf_dir.mkdir()
            (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
            body = wait_status(port, "/healthz", 503)
            assert f"cni-dirs: the CNI conf dir {mounted}" in body, body
            assert "was deleted on the node" in body, body
            wait_for(
                lambda: "\ncni-dirs: the CNI conf dir" in http_get(port, "/readyz")[1],
                "/readyz to name the deleted conf dir",
                5,
            )
            _, log = proc.stop()
        assert "CNI dir gone from under the agent" in log, log
    finally:
        os.close(held)


def test_a_full_disk_at_start_is_retried_not_fatal(node: Node) -> None:
    """ENOSPC at start, as mid-run: the agent keeps running, not Ready naming the error, and
    installs within seconds once space is freed (exiting would cost kubelet's back-off)."""
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    flag = node.root / "disk-full"
    flag.touch()
    port = free_port()
    config = node.write_config_yaml(metricsPort=port)
    command = [sys.executable, "-m", "tests.lifecycle.disk_full", str(flag)]
    with running_agent([*command, "run", "--config", str(config)]) as proc:
        wait_for(
            lambda: "No space left on device" in _readyz(port),
            "/readyz to name the full disk",
            10,
        )
        assert proc.proc.poll() is None
        flag.unlink()
        wait_installed(port, timeout=10)
        assert _has_entry(node)
        code, err = proc.stop()
    assert code == 0, err
