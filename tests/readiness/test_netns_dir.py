"""netns-dir on real namespaces and real sandbox processes in pod cgroups (testbed/podcgroup.py):
the dir must hold the namespace of at least one of the node's pods that run in their own, an
empty dir passes on a node with none, and an ADD naming a namespace outside it fails the check
at once. Every failure names the value (cniNetnsDir) and the dir."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agent.readiness.netns_dir import NetnsDirCheck
from testbed import netns
from testbed.podnetns import PodNamespaces

pytestmark = pytest.mark.netns


def check(netns_dir: str | Path, *uids: str) -> NetnsDirCheck:
    return NetnsDirCheck(netns_dir=str(netns_dir), proc_dir="/proc", pod_uids=lambda: set(uids))


def test_a_missing_dir_fails_naming_the_value(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    assert check(missing)() == (
        f"cniNetnsDir {missing} is not a directory: set cniNetnsDir to the runtime's netns dir"
    )
    (tmp_path / "a-file").write_text("")
    assert "is not a directory" in str(check(tmp_path / "a-file")())


def test_an_empty_dir_passes_while_no_pod_has_a_namespace(tmp_path: Path) -> None:
    assert check(tmp_path)() is None  # a fresh node: the first ADD decides


def test_the_runtimes_dir_holding_the_pods_namespace_passes(pod_namespaces: PodNamespaces) -> None:
    uid, _ = pod_namespaces.pod()
    assert check(netns.NETNS_DIR, uid)() is None


def test_a_dir_without_the_pods_namespaces_fails(
    pod_namespaces: PodNamespaces, tmp_path: Path
) -> None:
    uid, _ = pod_namespaces.pod()
    (tmp_path / "cni-stale").write_text("")  # a file is not a namespace of a pod
    reason = check(tmp_path, uid)()
    assert reason == (
        f"cniNetnsDir {tmp_path} holds none of the network namespaces of the 1 pod sandbox(es) "
        "running on this node: the container runtime keeps them in another dir; set cniNetnsDir "
        "to it"
    )


def test_sandboxes_of_pods_not_on_this_node_are_not_counted(
    pod_namespaces: PodNamespaces, tmp_path: Path
) -> None:
    pod_namespaces.pod()  # a process in some pod's cgroup, but no pod of this node (by the API)
    assert check(tmp_path, str(uuid.uuid4()))() is None


def test_one_pod_namespace_in_the_dir_is_enough(pod_namespaces: PodNamespaces) -> None:
    a, _ = pod_namespaces.pod()
    b, _ = pod_namespaces.pod()
    assert check(netns.NETNS_DIR, a, b)() is None


def test_an_add_naming_an_unseen_namespace_fails_until_one_names_a_seen_one(
    pod_namespaces: PodNamespaces, tmp_path: Path
) -> None:
    _, path = pod_namespaces.pod()
    seen = check(netns.NETNS_DIR)
    seen.saw_add("/var/run/docker/netns/3f2a1b0c9d8e")
    assert seen() == (
        f"cniNetnsDir {netns.NETNS_DIR}: the runtime named the network namespace "
        "/var/run/docker/netns/3f2a1b0c9d8e for a pod, which is not under it; set cniNetnsDir "
        "to /var/run/docker/netns"
    )
    seen.saw_add(path)  # the runtime's next ADD names one under the dir: right after all
    assert seen() is None
