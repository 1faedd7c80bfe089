"""Uninstall keeps the plugin binary while a runtime will still exec it at a sandbox's DEL.

CRI-O tears a sandbox down with the config libcni cached at its ADD (and Multus with the
delegates it cached), so a sandbox set up while our entry was chained still runs `istio-cni` at
DEL after uninstall removed the entry. The cache files here are laid out as libcni and Multus
write them (libcni: <cache>/results/<net>-<sandbox>-<ifname>, the config base64 in "config").
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from agent.install.installer import Installer
from agent.install.teardown_users import MAX_CACHE_FILE, sandboxes_needing_plugin
from testbed.agent_host import Node

CHAINED = {
    "cniVersion": "1.0.0",
    "name": "bridge",
    "plugins": [{"type": "bridge"}, {"type": "portmap"}, {"type": "istio-cni", "name": "x"}],
}
PRIMARY = {"cniVersion": "1.0.0", "name": "bridge", "plugins": [{"type": "bridge"}]}


def _libcni_entry(cache: pathlib.Path, sandbox: str, config: Mapping[str, Any]) -> pathlib.Path:
    results = cache / "results"
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"bridge-{sandbox}-eth0"
    entry = {
        "kind": "cniCacheV1",
        "containerId": sandbox,
        "config": base64.b64encode(json.dumps(config).encode()).decode(),
        "ifName": "eth0",
        "networkName": "bridge",
        "result": {"cniVersion": "1.0.0"},
    }
    path.write_text(json.dumps(entry))
    return path


def _proc(root: pathlib.Path, *comms: str) -> pathlib.Path:
    proc = root / "proc"
    for pid, comm in enumerate(comms, start=1):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / "self").mkdir(parents=True, exist_ok=True)
    return proc


def test_a_crio_sandbox_set_up_with_our_entry_needs_the_plugin(tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    ours = _libcni_entry(cache, "a" * 64, CHAINED)
    _libcni_entry(cache, "b" * 64, PRIMARY)  # set up before the agent chained in
    proc = _proc(tmp_path, "systemd", "crio", "kubelet")
    assert sandboxes_needing_plugin(str(cache), str(proc)) == [str(ours)]


def test_containerd_runs_del_with_the_current_config(tmp_path: pathlib.Path) -> None:
    """Its sandboxes' cache entries hold nothing back: the entry is gone from the conf dir."""
    cache = tmp_path / "cache"
    _libcni_entry(cache, "a" * 64, CHAINED)
    proc = _proc(tmp_path, "systemd", "containerd", "containerd-shim-runc-v2", "kubelet")
    assert sandboxes_needing_plugin(str(cache), str(proc)) == []


def test_multus_replays_its_cached_delegates_whatever_the_runtime(tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    (cache / "multus").mkdir(parents=True)
    delegates = {"cniVersion": "0.3.1", "name": "istio-cni", "type": "istio-cni"}
    (cache / "multus" / ("c" * 64)).write_text(json.dumps({"delegates": [delegates]}))
    (cache / "multus" / ("d" * 64)).write_text(json.dumps({"delegates": [PRIMARY]}))
    proc = _proc(tmp_path, "containerd")
    assert sandboxes_needing_plugin(str(cache), str(proc)) == [str(cache / "multus" / ("c" * 64))]


def test_unreadable_entries_are_skipped_not_fatal(tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    results = cache / "results"
    results.mkdir(parents=True)
    (results / "garbage").write_bytes(b"\xff{not json")
    (results / "bad-base64").write_text(json.dumps({"config": "!!!"}))
    (results / "not-an-object").write_text("[1, 2]")
    (results / "huge").write_bytes(b" " * (MAX_CACHE_FILE + 1))
    (results / "a-dir").mkdir()
    (results / "deep").write_text("[" * 100_000 + "]" * 100_000)
    proc = _proc(tmp_path, "crio")
    assert sandboxes_needing_plugin(str(cache), str(proc)) == []
    assert sandboxes_needing_plugin(str(tmp_path / "absent"), str(proc)) == []


def test_an_unreadable_proc_counts_as_a_runtime_that_replays(tmp_path: pathlib.Path) -> None:
    """Cannot tell the runtime: keeping an inert file beats pods stuck Terminating."""
    cache = tmp_path / "cache"
    ours = _libcni_entry(cache, "a" * 64, CHAINED)
    assert sandboxes_needing_plugin(str(cache), str(tmp_path / "no-proc")) == [str(ours)]


def _installed(node: Node, tmp_path: pathlib.Path, *comms: str) -> Installer:
    node.write_primary(PRIMARY, "10-bridge.conflist")
    node.with_settings(hostProcDir=str(_proc(tmp_path, *comms)))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    installer.install()
    assert (node.bin_dir / "istio-cni").is_file()
    return installer


def test_uninstall_on_crio_keeps_the_binary_while_a_sandbox_needs_it(
    node: Node, tmp_path: pathlib.Path
) -> None:
    installer = _installed(node, tmp_path, "crio")
    entry = _libcni_entry(pathlib.Path(node.settings.mountedCniCacheDir), "a" * 64, CHAINED)
    installer.uninstall()
    assert node.conf("10-bridge.conflist") == PRIMARY, "the entry goes all the same"
    assert (node.bin_dir / "istio-cni").is_file()
    entry.unlink()  # the pod's DEL ran: CRI-O dropped its cache entry
    Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system").uninstall()
    assert not (node.bin_dir / "istio-cni").exists()


def test_uninstall_on_containerd_removes_the_binary(node: Node, tmp_path: pathlib.Path) -> None:
    installer = _installed(node, tmp_path, "containerd")
    _libcni_entry(pathlib.Path(node.settings.mountedCniCacheDir), "a" * 64, CHAINED)
    installer.uninstall()
    assert node.conf("10-bridge.conflist") == PRIMARY
    assert not (node.bin_dir / "istio-cni").exists()
