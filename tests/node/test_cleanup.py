"""A real node leaves nothing behind: after stop(), and after its test process was killed (the
next session's start sweeps it). Each test runs a node of its own with one pod on it.

Only what this node made is compared (found by its record: its work dir, netns, veth, CNI network,
runtime socket, record file), so another test bed running on the machine at the same time, with
nodes of its own, neither hides a leftover nor makes one up."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from testbed import kubepods, netns, nodeclean
from testbed.parts import REPO_ROOT, MissingPartError
from testbed.platforms import RUNTIME_VARIANTS
from testbed.process import pid_alive
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

IMAGES = ("pause", "workload")


def other_nodes_running(own: Path) -> bool:
    """A node of another live test process is on the machine (its kubelet sets the sysctls)."""
    for path in nodeclean.RECORDS.glob("*.json"):
        if path == own:
            continue
        try:
            owner = int(json.loads(path.read_text())["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(owner):
            return True
    return False


def leftovers(workdir: Path, record: dict[str, Any]) -> list[str]:
    """Everything of the node (by its record) that is still on the machine."""
    own_record = nodeclean.NodeRecord(**record).path
    found = [f"record {own_record}"] if own_record.exists() else []
    # The kernel settings are the machine's: restored to what this node found, unless another
    # node's kubelet (which sets them at its start) runs meanwhile.
    if not other_nodes_running(own_record):
        now = nodeclean.snapshot_sysctls()
        found += [
            f"sysctl {key}={now.get(key)} (was {value})"
            for key, value in record["sysctls"].items()
            if now.get(key) != value
        ]
    found += [f"mount {p}" for p in nodeclean.mounted_below(workdir)]
    found += [f"process {pid}" for pid in nodeclean.pids_with_cmdline(record["runtime_socket"])]
    if (workdir / "node").exists():
        found.append(f"dir {workdir / 'node'}")
    traversable = nodeclean.NodeRecord(**record).traversable_dir
    found += [f"mount {p}" for p in nodeclean.mounted_below(traversable)]
    if traversable.exists():
        found.append(f"dir {traversable}")
    if netns.exists(record["netns_name"]):
        found.append(f"netns {record['netns_name']}")
    if any(link["ifname"] == record["host_ifname"] for link in netns.ip_json("link", "show")):
        found.append(f"link {record['host_ifname']}")
    found += [f"cni cache {p}" for p in nodeclean.LIBCNI_CACHE.glob(f"{record['cni_network']}-*")]
    found += [
        f"log link {p}"
        for p in nodeclean.CONTAINER_LOG_LINKS.glob("*")
        if p.is_symlink() and str(p.readlink()).startswith(str(workdir))
    ]
    return found


def test_stop_leaves_nothing_behind(tmp_path: Path) -> None:
    try:
        cluster = RealCluster(tmp_path, image_names=IMAGES)
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        cluster.start()
        assert cluster.record is not None
        record = dataclasses.asdict(cluster.record)
        core = cluster.core()
        core.create_namespaced_pod(
            "default",
            kubepods.pod_manifest(
                "one", cluster.images["workload"].ref, app_command=["sleep"], sidecar=False
            ),
        )
        kubepods.wait_running(core, "default", "one")
        assert nodeclean.pids_with_cmdline(str(cluster.runtime_dirs.socket))  # shims run
        assert nodeclean.mounted_below(tmp_path)
        assert nodeclean.NodeRecord(**record).path.is_file()
    finally:
        cluster.stop()
    assert leftovers(tmp_path, record) == []
    assert (tmp_path / "logs" / "kubelet.log").is_file()  # the logs stay for post-mortems


def test_stop_removes_containerd2_state_outside_the_node_dir(tmp_path: Path) -> None:
    """containerd 2 keeps its state (rootfs mount points, pinned namespaces) in a dir every uid
    may traverse, outside the node's: a user-namespaced pod's root walks to its rootfs there.
    stop() removes it with the rest."""
    try:
        cluster = RealCluster(tmp_path, image_names=IMAGES)
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        cluster.start()
        assert cluster.record is not None
        record = dataclasses.asdict(cluster.record)
        cluster.relayout(RUNTIME_VARIANTS["kind-on-containerd2"])
        assert cluster.containerd2 is not None
        state = cluster.containerd2.dirs.state
        assert state.is_relative_to(cluster.record.traversable_dir), state
        for d in (state, *state.parents):  # searchable by a uid the machine does not know
            assert d.stat().st_mode & 0o001, oct(d.stat().st_mode)
        core = cluster.core()
        manifest = kubepods.pod_manifest(
            "one", cluster.images["workload"].ref, app_command=["sleep"], sidecar=False
        )
        manifest["spec"]["hostUsers"] = False
        core.create_namespaced_pod("default", manifest)
        kubepods.wait_running(core, "default", "one")
        assert (state / "io.containerd.runtime.v2.task").is_dir()
    finally:
        cluster.stop()
    assert leftovers(tmp_path, record) == []


NODE_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from testbed import kubepods
    from testbed.realnode import RealCluster
    cluster = RealCluster(Path(sys.argv[1]), image_names=("pause", "workload"))
    cluster.start()
    core = cluster.core()
    core.create_namespaced_pod("default", kubepods.pod_manifest(
        "one", cluster.images["workload"].ref, app_command=["sleep"], sidecar=False))
    kubepods.wait_running(core, "default", "one")
    print(str(cluster.runtime_dirs.socket), flush=True)
    time.sleep(3600)
""")


def test_a_killed_session_is_swept_by_the_next(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_SCRIPT, str(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        socket = proc.stdout.readline().strip()
        assert socket, proc.communicate(timeout=60)[1][-3000:]
        records = list(nodeclean.RECORDS.glob(f"{proc.pid}-*.json"))
        assert len(records) == 1
        record = json.loads(records[0].read_text())
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no teardown, no exit handlers
        proc.communicate()
    # Its children die with it (kubelet, containerd, the control plane); shims, containers,
    # mounts, the node netns and the files stay until the next node's start sweeps them.
    assert nodeclean.pids_with_cmdline(socket), "the shims outlive the killed session"
    assert netns.exists(record["netns_name"])
    assert leftovers(tmp_path, record), "the killed node's parts are there to be swept"
    nodeclean.sweep_stale()
    assert leftovers(tmp_path, record) == []
