"""The strict ztunnel stand-in's checks (testbed.zds_checks), message by message: each rule
ztunnel holds the agent to, and the messages that pass."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agent.ambient import zds_pb2
from agent.ambient.zds_conn import delete_request
from testbed.zds_checks import PodIdentity, ZdsChecks

WEB = PodIdentity("uid-web", "web", "shop", "web-sa")


class Netns:
    """Descriptors of this process's own network namespace (no root needed); every one stands
    for the same sandbox (one netns cookie)."""

    def __init__(self) -> None:
        self.captured = True
        """What the namespace's rules say: redirecting to ztunnel or not."""
        self.fds: list[int] = []

    def open(self) -> int:
        fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.fds.append(fd)
        return fd

    def redirects(self, fd: int) -> bool:
        return self.captured


@pytest.fixture
def netns() -> Iterator[Netns]:
    made = Netns()
    yield made
    for fd in made.fds:
        os.close(fd)


def checks(netns: Netns, *pods: PodIdentity) -> ZdsChecks:
    made = ZdsChecks(lookup=None, cookie=lambda fd: 7, redirects=netns.redirects)
    made.tell(*pods)
    return made


def add(uid: str = WEB.uid, info: PodIdentity = WEB) -> zds_pb2.WorkloadRequest:
    return zds_pb2.WorkloadRequest(
        add=zds_pb2.AddWorkload(
            uid=uid,
            workload_info=zds_pb2.WorkloadInfo(
                name=info.name, namespace=info.namespace, service_account=info.service_account
            ),
        )
    )


def keep(uid: str) -> zds_pb2.WorkloadRequest:
    return zds_pb2.WorkloadRequest(keep=zds_pb2.KeepWorkload(uid=uid))


def delete(uid: str) -> zds_pb2.WorkloadRequest:
    return delete_request(uid)


SENT = zds_pb2.WorkloadRequest(snapshot_sent=zds_pb2.SnapshotSent())


def net(netns: Netns) -> list[int]:
    return [netns.open()]


def test_a_well_behaved_conversation_passes(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.said_hello()
    c.request(add(), net(netns))
    c.answered(add(), "")
    c.request(SENT, [])
    c.request(delete(WEB.uid), [])
    c.disconnected()
    c.said_hello()  # the next connection: a snapshot again
    c.request(SENT, [])
    c.close()
    assert c.violations == []


def test_a_request_before_hello_and_a_del_inside_the_snapshot(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.request(SENT, [])
    c.said_hello()
    c.request(delete(WEB.uid), [])
    assert c.violations == [
        "snapshot_sent before ztunnel's hello",
        "SnapshotSent outside a snapshot (a second one)",
        f"DelWorkload {WEB.uid}: before SnapshotSent",
    ]


def test_workload_info_must_be_the_pods(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.said_hello()
    c.request(add(info=PodIdentity(WEB.uid, "web", "shop", "default")), net(netns))
    [violation] = c.violations
    assert "('web', 'shop', 'default'), pod ('web', 'shop', 'web-sa')" in violation


def test_the_api_servers_pod_is_the_reference_when_told_nothing(netns: Netns) -> None:
    c = ZdsChecks(
        lookup=lambda uid, ns, name: PodIdentity(uid, name, ns, "payments"),
        cookie=lambda fd: 1,
        redirects=netns.redirects,
    )
    c.said_hello()
    c.request(add(), net(netns))
    assert len(c.violations) == 1 and "'payments'" in c.violations[0]


def test_the_descriptor_must_be_one_network_namespace(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.said_hello()
    c.request(add(), [])
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
    plain = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        c.request(add(), [fd])
        c.request(add(), [plain])
    finally:
        os.close(fd)
        os.close(plain)
    assert c.violations[0] == f"AddWorkload {WEB.uid}: 0 descriptors, not one network namespace"
    assert "namespace type 0x4000000" in c.violations[1]  # CLONE_NEWUTS
    assert "not a namespace" in c.violations[2]


def test_keep_only_inside_a_snapshot_for_a_pod_ztunnel_holds(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.hold("uid-old")
    c.said_hello()
    c.request(keep("uid-old"), [])
    c.request(keep("uid-never"), [])
    c.request(SENT, [])
    c.request(keep("uid-old"), [])
    assert c.violations == [
        "KeepWorkload uid-never: a pod this ztunnel does not hold",
        "KeepWorkload uid-old: outside a snapshot",
    ]


def test_snapshot_drops_what_it_did_not_name(netns: Netns) -> None:
    c = checks(netns)
    c.hold("uid-a", "uid-b")
    c.said_hello()
    c.request(keep("uid-a"), [])
    c.request(SENT, [])
    c.disconnected()
    c.said_hello()
    c.request(keep("uid-b"), [])
    assert c.violations == ["KeepWorkload uid-b: a pod this ztunnel does not hold"]


def test_a_pod_a_restarted_ztunnels_snapshot_added_is_held_for_the_next_snapshot(
    netns: Netns,
) -> None:
    # ztunnel restarts: the agent's snapshot adds the pod anew; then the agent restarts and,
    # not finding the pod's namespace, keeps it: ztunnel holds it, so that is no violation.
    c = checks(netns, WEB)
    c.restarted()
    c.said_hello()
    c.request(add(), net(netns))
    c.answered(add(), "")
    c.request(SENT, [])
    c.disconnected()
    c.said_hello()
    c.request(keep(WEB.uid), [])
    c.request(SENT, [])
    c.close()
    assert c.violations == []


def test_a_pod_let_go_while_captured_may_not_come_back_in_the_same_sandbox(
    netns: Netns,
) -> None:
    c = checks(netns, WEB)
    c.said_hello()
    c.request(SENT, [])
    c.request(add(), net(netns))
    c.request(delete(WEB.uid), [])  # its netns still redirects to ztunnel
    c.request(add(), net(netns))
    c.close()
    assert c.violations == [
        f"AddWorkload {WEB.uid}: the same sandbox again after a DelWorkload that left it captured"
    ]


def test_a_pod_released_properly_may_come_back(netns: Netns) -> None:
    c = checks(netns, WEB)
    c.said_hello()
    c.request(SENT, [])
    c.request(add(), net(netns))
    netns.captured = False  # its in-pod rules removed before the DelWorkload
    c.request(delete(WEB.uid), [])
    netns.captured = True
    c.request(add(), net(netns))
    c.close()
    assert c.violations == []
