"""The fault catalogue and each kind's act (bench/soak/faults.py, bench/soak/actions.py), on
real processes and files where the act can run without a node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.soak import actions, faults
from bench.soak.faults import Held, Instant

PRIMARY = {"cniVersion": "1.0.0", "name": "kindnet", "plugins": [{"type": "ptp"}]}


def test_the_catalogue_names_every_kind_of_the_soak_once() -> None:
    names = [k.name for k in faults.CATALOGUE]
    assert len(names) == len(set(names))
    assert set(names) == {
        "agent_kill9", "agent_pod_delete", "runtime_restart", "node_reboot", "api_stopped",
        "api_silence", "api_429", "api_401", "etcd_restart", "conflist_rewrite",
        "conflist_delete", "plugin_delete", "helm_upgrade", "helm_rollback", "ztunnel_restart",
        "conf_dir_full", "agent_cpu_throttle",
    }  # fmt: skip
    for kind in faults.unavailable():
        assert len(kind.unavailable) > 20, kind  # a reason, not a flag


def test_the_faults_on_one_part_share_a_group() -> None:
    group = {k.name: k.exclusive for k in faults.CATALOGUE}
    assert group["api_429"] == group["api_401"] == group["api_silence"] == group["api_stopped"]
    assert group["helm_upgrade"] == group["helm_rollback"]
    assert group["agent_kill9"] != group["conflist_delete"]


def test_an_instant_fault_acts_once_and_recovers_when_healthy() -> None:
    done: list[str] = []
    healthy = [False]
    fault = Instant("k", ("n",), lambda: done.append("act"), lambda: healthy[0])
    fault.start()
    fault.stop()
    assert done == ["act"] and not fault.recovered()
    healthy[0] = True
    assert fault.recovered()


def test_a_held_fault_is_not_recovered_while_held_and_ends_once() -> None:
    done: list[str] = []
    fault = Held("k", (), lambda: done.append("begin"), lambda: done.append("end"), lambda: True)
    fault.start()
    assert not fault.recovered()
    fault.stop()
    fault.stop()
    assert done == ["begin", "end"] and fault.recovered()


def test_kill9_kills_a_process_and_a_gone_one_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        actions.kill9(proc.pid)
        assert proc.wait(10) == -9
        actions.kill9(proc.pid)  # reaped: no such process
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("12:cpu,cpuacct:/kubepods/pod1/abc\n0::/x\n", "cpu/kubepods/pod1/abc"),
        ("4:cpu:/k/p/c\n3:memory:/k/p/c\n", "cpu/k/p/c"),
        ("0::/kubepods.slice/pod1/abc\n", "kubepods.slice/pod1/abc"),
    ],
    ids=["v1-joined", "v1", "v2"],
)
def test_the_cpu_cgroup_of_a_process_is_found_in_v1_and_v2(
    tmp_path: Path, lines: str, expected: str
) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(lines)
    assert actions.cpu_cgroup(42, proc=tmp_path) == actions.CGROUP_FS / expected


def test_a_process_without_a_cpu_cgroup_is_named(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("3:memory:/k\n")
    with pytest.raises(actions.ActError, match="42"):
        actions.cpu_cgroup(42, proc=tmp_path)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_throttle_sets_the_quota_and_its_undo_restores_it(tmp_path: Path, version: str) -> None:
    name, before = ("cpu.cfs_quota_us", "-1\n") if version == "v1" else ("cpu.max", "max 100000\n")
    (tmp_path / name).write_text(before)
    undo = actions.throttle(tmp_path, percent=2)
    assert (tmp_path / name).read_text() == ("2000\n" if version == "v1" else "2000 100000\n")
    undo()
    assert (tmp_path / name).read_text() == before


def test_throttles_undo_is_done_when_the_cgroup_went_with_its_container(tmp_path: Path) -> None:
    cgroup = tmp_path / "pod1" / "c1"
    cgroup.mkdir(parents=True)
    (cgroup / "cpu.cfs_quota_us").write_text("-1\n")
    undo = actions.throttle(cgroup, percent=2)
    (cgroup / "cpu.cfs_quota_us").unlink()  # cgroupfs: the container's dir removed with it
    cgroup.rmdir()
    undo()  # nothing to restore, no error
    assert not cgroup.exists()


def test_fill_refuses_a_dir_that_is_not_a_mount_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(actions.ActError, match="not a mount"):
        actions.fill(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fill_refuses_a_large_file_system() -> None:
    with pytest.raises(actions.ActError, match="more than"):
        actions.fill(Path("/"), limit=1)


def parts_on(tmp_path: Path, **extra: Any) -> actions.Parts:
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    conf_dir.mkdir()
    bin_dir.mkdir()
    ours = {**PRIMARY, "plugins": [*PRIMARY["plugins"], {"type": "istio-cni"}]}
    (conf_dir / "10-kindnet.conflist").write_text(json.dumps(ours))
    (bin_dir / "istio-cni").write_text("plugin")

    def missing(*_: Any) -> Any:
        raise AssertionError("not this part")

    base: dict[str, Any] = {
        "agent_pid": missing, "delete_agent_pod": missing, "runtime_restart": missing,
        "conflist": lambda node: conf_dir / "10-kindnet.conflist",
        "primary_conf": lambda node: dict(PRIMARY),
        "plugin": lambda node: bin_dir / "istio-cni",
        "conf_dir": lambda node: conf_dir,
        "node_healthy": lambda node: True, "cluster_healthy": lambda: True,
    }  # fmt: skip
    return actions.Parts(**(base | extra))


def kind(name: str) -> faults.FaultKind:
    return faults.catalogue_by_name()[name]


def test_conflist_rewrite_writes_the_primary_without_our_entry(tmp_path: Path) -> None:
    parts = parts_on(tmp_path)
    fault = actions.build(kind("conflist_rewrite"), "n1", parts)
    assert fault.kind == "conflist_rewrite" and fault.nodes == ("n1",)
    fault.start()
    assert json.loads(parts.conflist("n1").read_text()) == PRIMARY


def test_conflist_delete_removes_the_file_and_puts_the_primary_back_at_stop(tmp_path: Path) -> None:
    parts = parts_on(tmp_path)
    fault = actions.build(kind("conflist_delete"), "n1", parts)
    fault.start()
    assert not parts.conflist("n1").exists()
    fault.stop()
    assert json.loads(parts.conflist("n1").read_text()) == PRIMARY


def test_plugin_delete_removes_the_binary(tmp_path: Path) -> None:
    parts = parts_on(tmp_path)
    actions.build(kind("plugin_delete"), "n1", parts).start()
    assert not parts.plugin("n1").exists()


def test_api_faults_set_and_clear_the_proxy(tmp_path: Path) -> None:
    seen: list[str] = []

    def set_fault(which: str) -> Any:
        seen.append(f"set {which}")
        return lambda: seen.append(f"clear {which}")

    fault = actions.build(kind("api_429"), None, parts_on(tmp_path, api_fault=set_fault))
    assert fault.nodes == ()
    fault.start()
    fault.stop()
    assert seen == ["set 429", "clear 429"]


def test_etcd_restart_stops_then_starts_and_api_stopped_holds(tmp_path: Path) -> None:
    seen: list[str] = []
    daemons = {
        name: (lambda n=name: seen.append(f"stop {n}"), lambda n=name: seen.append(f"start {n}"))
        for name in ("etcd", "kube-apiserver")
    }
    parts = parts_on(tmp_path, daemons=daemons)
    actions.build(kind("etcd_restart"), None, parts).start()
    held = actions.build(kind("api_stopped"), None, parts)
    held.start()
    assert seen == ["stop etcd", "start etcd", "stop kube-apiserver"]
    held.stop()
    assert seen[-1] == "start kube-apiserver"


@pytest.mark.parametrize(
    ("name", "node", "match"),
    [
        ("node_reboot", "n1", "cannot reboot"),
        ("ztunnel_restart", "n1", "no ztunnel"),
        ("api_silence", None, "no API fault proxy"),
        ("helm_rollback", None, "no Helm release"),
        ("agent_kill9", None, "no node given"),
    ],
)
def test_a_kind_the_parts_cannot_do_is_refused_naming_why(
    tmp_path: Path, name: str, node: str | None, match: str
) -> None:
    with pytest.raises(actions.ActError, match=match):
        actions.build(kind(name), node, parts_on(tmp_path))


def test_a_node_reboot_is_an_instant_act_recovered_once_the_node_is_ready(
    tmp_path: Path,
) -> None:
    reboot = kind("node_reboot")
    assert reboot.available
    (tmp_path / "without").mkdir()
    (tmp_path / "with").mkdir()
    with pytest.raises(actions.ActError, match="cannot reboot"):
        actions.build(reboot, "n1", parts_on(tmp_path / "without"))
    rebooted: list[str] = []
    ready: set[str] = set()
    parts = parts_on(tmp_path / "with", node_reboot=rebooted.append, node_ready=ready.__contains__)
    fault = actions.build(reboot, "n2", parts)
    assert fault.instant and fault.nodes == ("n2",)
    fault.start()
    assert rebooted == ["n2"]
    assert not fault.recovered()  # the agent healthy, the Node not Ready yet
    ready.add("n2")
    assert fault.recovered()


def test_a_ztunnel_restart_recovers_once_the_node_and_its_new_stand_in_are_whole(
    tmp_path: Path,
) -> None:
    restarted: list[str] = []
    whole = {"n1": False}
    healthy = {"n1": True}
    parts = parts_on(
        tmp_path,
        ztunnel_restart=restarted.append,
        ztunnel_whole=lambda node: whole[node],
        node_healthy=lambda node: healthy[node],
    )
    fault = actions.build(kind("ztunnel_restart"), "n1", parts)
    assert fault.instant and fault.nodes == ("n1",)
    fault.start()
    assert restarted == ["n1"]
    assert not fault.recovered()  # the new stand-in lacks its snapshot
    whole["n1"], healthy["n1"] = True, False
    assert not fault.recovered()  # the agent not Ready
    healthy["n1"] = True
    assert fault.recovered()
    (tmp_path / "x").mkdir()
    with pytest.raises(actions.ActError, match="no ztunnel"):
        parts = parts_on(tmp_path / "x", ztunnel_restart=print)  # no ztunnel_whole
        actions.build(kind("ztunnel_restart"), "n1", parts)


def test_every_available_kind_builds_on_a_bed_with_every_part(tmp_path: Path) -> None:
    nothing = lambda *_: None  # noqa: E731 (the acts are not run here)
    parts = parts_on(
        tmp_path,
        daemons={"etcd": (nothing, nothing), "kube-apiserver": (nothing, nothing)},
        api_fault=lambda which: nothing,
        helm={"upgrade": nothing, "rollback": nothing},
        ztunnel_restart=nothing,
        node_reboot=nothing,
        node_ready=lambda node: True,
        ztunnel_whole=lambda node: True,
    )
    for k in faults.available():
        fault = actions.build(k, "n1" if k.scope == "node" else None, parts)
        assert fault.kind == k.name
