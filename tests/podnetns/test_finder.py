"""The pod netns finder on real namespaces and real processes in pod cgroups (the test bed's
sandbox processes, testbed/podcgroup.py): a pod's namespace is the one its own processes are in,
whatever other namespaces hold its IP; an IP alone names no pod."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.netns.look import netns_addresses
from agent.podnetns.finder import PodNetnsFinder
from testbed import netns
from testbed.podnetns import PodNamespaces

pytestmark = pytest.mark.netns

CONFLICTS = "istio_cni_pod_netns_conflicts_total"


def pod(uid: str, *ips: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"p-{uid[:6]}", "namespace": "ns"},
        "status": {"podIPs": [{"ip": ip} for ip in ips]},
    }


def finder(netns_dir: str = str(netns.NETNS_DIR), **kw: Any) -> PodNetnsFinder:
    return PodNetnsFinder(
        proc_dir="/proc", netns_dir=netns_dir, read_addresses=netns_addresses, **kw
    )


def conflicts(kind: str) -> float:
    return REGISTRY.get_sample_value(CONFLICTS, {"kind": kind}) or 0.0


def test_found_by_the_cgroup_of_its_sandbox_process(pod_namespaces: PodNamespaces) -> None:
    uid = str(uuid.uuid4())
    path = pod_namespaces.netns("10.251.1.2")
    pod_namespaces.sandboxes.start(path, uid)
    assert finder()([pod(uid, "10.251.1.2")]) == {uid: path}  # the runtime's mount names it


def test_a_netns_held_only_by_a_process_is_found_through_proc(
    pod_namespaces: PodNamespaces, tmp_path: Path
) -> None:
    uid = str(uuid.uuid4())
    path = pod_namespaces.netns("10.251.1.3")
    pid = pod_namespaces.sandboxes.start(path, uid)
    # No mount dir to look in: only /proc leads to the namespace.
    assert finder(str(tmp_path))([pod(uid, "10.251.1.3")]) == {uid: f"/proc/{pid}/ns/net"}


@pytest.mark.hostile
def test_an_ip_alone_names_no_pod(pod_namespaces: PodNamespaces) -> None:
    """A namespace that holds the pod's IP but in which no process of the pod runs."""
    uid = str(uuid.uuid4())
    pod_namespaces.netns("10.251.1.4")
    other = pod_namespaces.netns("10.251.1.40")
    pod_namespaces.sandboxes.start(other, str(uuid.uuid4()))  # a neighbour, not this pod
    assert finder()([pod(uid, "10.251.1.4")]) == {}


@pytest.mark.hostile
def test_a_neighbour_holding_the_victims_ip_changes_nothing_and_is_reported(
    pod_namespaces: PodNamespaces,
) -> None:
    victim, attacker = str(uuid.uuid4()), str(uuid.uuid4())
    victim_ns = pod_namespaces.netns("10.251.2.2")
    attacker_ns = pod_namespaces.netns("10.251.2.3", "10.251.2.2")  # what NET_ADMIN lets it add
    pod_namespaces.sandboxes.start(victim_ns, victim)
    pod_namespaces.sandboxes.start(attacker_ns, attacker)
    before = conflicts("address")
    look = finder()
    pods = [pod(victim, "10.251.2.2"), pod(attacker, "10.251.2.3")]
    assert look(pods) == {victim: victim_ns, attacker: attacker_ns}
    assert conflicts("address") == before + 1
    assert look(pods) == {victim: victim_ns, attacker: attacker_ns}
    assert conflicts("address") == before + 1  # once per pod and namespace, not every look


@pytest.mark.hostile
def test_a_process_of_the_pod_in_a_foreign_namespace_is_not_the_pods(
    pod_namespaces: PodNamespaces,
) -> None:
    """The pod's UID in the cgroup, in a namespace that holds none of the pod's IPs (a process
    transiting another namespace): refused and counted."""
    uid = str(uuid.uuid4())
    elsewhere = pod_namespaces.netns("10.251.3.9")
    pod_namespaces.sandboxes.start(elsewhere, uid)
    before = conflicts("unowned")
    assert finder()([pod(uid, "10.251.3.2")]) == {}
    assert conflicts("unowned") == before + 1


@pytest.mark.hostile
def test_two_namespaces_of_the_pod_with_its_ip_are_an_error_not_a_choice(
    pod_namespaces: PodNamespaces,
) -> None:
    uid = str(uuid.uuid4())
    first, second = pod_namespaces.netns("10.251.4.2"), pod_namespaces.netns("10.251.4.2")
    pod_namespaces.sandboxes.start(first, uid)
    pod_namespaces.sandboxes.start(second, uid)
    before = conflicts("ambiguous")
    assert finder()([pod(uid, "10.251.4.2")]) == {}
    assert conflicts("ambiguous") == before + 1


def test_what_the_add_recorded_comes_first(pod_namespaces: PodNamespaces) -> None:
    """The netns a CNI ADD named for the pod's UID needs no process at all."""
    uid = str(uuid.uuid4())
    path = pod_namespaces.netns("10.251.5.2")
    recorded = {uid: path}
    assert finder(recorded=recorded.get)([pod(uid, "10.251.5.2")]) == {uid: path}
    assert finder()([pod(uid, "10.251.5.2")]) == {}  # without the record: no identity, none
