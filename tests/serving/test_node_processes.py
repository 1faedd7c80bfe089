"""Kubelet's probes and a hostNetwork pod's flood share the node's address: the HTTP port tells
them apart by the process holding the peer's socket (agent.serving.node_processes). Real sockets
and the kernel's sock_diag; the /proc the agent reads is the machine's, but for each process's
cgroup file, written here as kubelet writes a pod's (or a node service's)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent.http_server import HttpServer
from agent.liveness import Liveness
from agent.podnetns.cgroup import pod_uid_of_cgroups
from agent.serving.budget import HTTP, Budget
from agent.serving.node_processes import NodeProcesses
from agent.serving.origins import MAX_WAITING, Origins
from agent.serving.socket_diag import peer_socket_inode
from tests.serving.raw import probe

NODE_CGROUP = (
    "12:pids:/system.slice/kubelet.service\n1:name=systemd:/system.slice/kubelet.service\n"
)
POD_CGROUP = (
    "12:pids:/kubepods/besteffort/pod2c48913c-b29f-11e7-9350-020968147796/{cid}\n"
    "1:name=systemd:/kubepods/besteffort/pod2c48913c-b29f-11e7-9350-020968147796/{cid}\n"
)
CID = "0123456789abcdef" * 4


def as_process(proc: Path, pid: int, cgroup: str) -> None:
    """`pid` in the /proc at `proc`: its real descriptors, the cgroup file given."""
    entry = proc / str(pid)
    entry.mkdir()
    (entry / "fd").symlink_to(f"/proc/{pid}/fd")
    (entry / "cgroup").write_text(cgroup)


def pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_kernel_names_the_peers_socket() -> None:
    listener, client, accepted = pair()
    with listener, client, accepted:
        assert peer_socket_inode(accepted) == os.fstat(client.fileno()).st_ino
        client.close()
        time.sleep(0.05)
        assert peer_socket_inode(accepted) is None  # closed: no process holds it


@pytest.mark.parametrize(
    ("cgroup", "made"), [(NODE_CGROUP, True), (POD_CGROUP.format(cid=CID), False)]
)
def test_a_connection_is_the_nodes_when_a_process_in_no_pods_cgroup_holds_its_end(
    tmp_path: Path, cgroup: str, made: bool
) -> None:
    as_process(tmp_path, os.getpid(), cgroup)
    node = NodeProcesses(str(tmp_path), pod_uid_of_cgroups)
    listener, client, accepted = pair()
    with listener, client, accepted:
        inode = peer_socket_inode(accepted)
        assert inode is not None
        assert node.scan({inode}) == ({inode} if made else set())
        assert node.held(inode) is made  # a node process found is remembered, its sockets listed


def connection() -> tuple[list[socket.socket], int]:
    listener, client, accepted = pair()
    inode = peer_socket_inode(accepted)
    assert inode is not None
    return [listener, client, accepted], inode


def test_a_known_node_process_is_told_by_listing_its_sockets_alone(tmp_path: Path) -> None:
    now = [100.0]
    as_process(tmp_path, os.getpid(), NODE_CGROUP)
    node = NodeProcesses(
        str(tmp_path), pod_uid_of_cgroups, clock=lambda: now[0], refresh_every=0.01
    )
    opened: list[socket.socket] = []
    try:
        assert node.scan_due()
        socks, first = connection()
        opened += socks
        assert node.scan({first}) == {first}
        assert not node.scan_due()  # one a second
        socks, second = connection()  # connected after the listing: not in it
        opened += socks
        assert not node.held(second)
        assert not node.relist_due()
        now[0] += 0.01
        assert node.relist_due()
        node.relist()
        assert node.held(second)  # listed again: no scan needed
        (tmp_path / str(os.getpid()) / "fd").unlink()  # the process gone
        now[0] += 0.01
        node.relist()
        assert not node.held(first)  # and forgotten: a later scan finds it again
        now[0] += 1.0
        assert node.scan_due()
    finally:
        for sock in opened:
            sock.close()


FLOOD = textwrap.dedent(
    """
    import json, socket, sys, time
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    sys.stdin.readline()  # its cgroup is written
    counts = {"rounds": 0, "replies": 0, "cut": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        counts["rounds"] += 1
        data = b""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: n\\r\\n\\r\\n" * 200)
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            counts["cut"] += 1  # closed unread, or reset
        counts["replies"] += data.count(b"HTTP/1.1 ")
    print(json.dumps(counts))
    """
)


@pytest.fixture
def node_proc(tmp_path: Path) -> Path:
    as_process(tmp_path, os.getpid(), NODE_CGROUP)  # this test: kubelet
    return tmp_path


def serve(proc_dir: Path | None) -> HttpServer:
    srv = HttpServer(
        port=0,
        host="127.0.0.1",
        loops=Liveness().failing,
        node=None if proc_dir is None else NodeProcesses(str(proc_dir), pod_uid_of_cgroups),
    )
    srv.start()
    return srv


def flooded_probes(port: int, pod_proc: Path) -> tuple[list[bytes], dict[str, int]]:
    """A hostNetwork pod's process floods from the node's address while kubelet probes."""
    assert probe(port) == b"HTTP/1.1 200 OK"  # kubelet's first probe, before any flood
    pod = subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(port), "4"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        as_process(pod_proc, pod.pid, POD_CGROUP.format(cid=CID))
        assert pod.stdin is not None
        pod.stdin.write("go\n")
        pod.stdin.flush()
        time.sleep(0.5)
        statuses = []
        for _ in range(12):
            statuses.append(probe(port))
            time.sleep(0.2)
        out, _ = pod.communicate(timeout=30)
    finally:
        pod.kill()
        pod.wait()
    return statuses, json.loads(out)


def test_a_hostnetwork_pods_flood_leaves_kubelets_probes_answered(node_proc: Path) -> None:
    srv = serve(node_proc)
    try:
        statuses, flood = flooded_probes(srv.bound_port, node_proc)
    finally:
        srv.stop()
    assert 0 < flood["replies"] < 200 * flood["rounds"], flood  # the pod's flood met its budget
    assert statuses == [b"HTTP/1.1 200 OK"] * 12, (statuses, flood)


def test_without_the_nodes_processes_told_apart_the_same_flood_spends_kubelets_probes(
    tmp_path: Path,
) -> None:
    """What the test above guards against: charged by address alone, kubelet's probes are
    refused during the same flood."""
    srv = serve(None)
    try:
        statuses, flood = flooded_probes(srv.bound_port, tmp_path)
    finally:
        srv.stop()
    assert statuses.count(b"HTTP/1.1 200 OK") < len(statuses), (statuses, flood)


class BrokenScan(NodeProcesses):
    def scan(self, inodes: set[int]) -> set[int]:
        raise RuntimeError("the node's /proc went away")


def test_a_failing_scan_charges_the_waiting_connections_to_their_address_and_the_loop_serves_on(
    tmp_path: Path,
) -> None:
    """Every local connection waits for a scan that fails: each is then charged to its address
    (answered while its budget lasts), and the port keeps answering."""
    node = BrokenScan(str(tmp_path), pod_uid_of_cgroups)
    srv = HttpServer(port=0, host="127.0.0.1", loops=Liveness().failing, node=node)
    srv.start()
    try:
        statuses = [probe(srv.bound_port) for _ in range(5)]
    finally:
        srv.stop()
    assert statuses == [b"HTTP/1.1 200 OK"] * 5


def test_connections_waiting_for_a_scan_are_bounded_and_told_by_the_next_one(
    tmp_path: Path,
) -> None:
    """A pod's connections from the node's address, its budget contested, wait for the next scan
    (once a second): at most MAX_WAITING of them, the oldest past it charged to its address at
    once; the scan then charges every one to its address (a pod's process holds them)."""
    now = [100.0]
    as_process(tmp_path, os.getpid(), POD_CGROUP.format(cid=CID))  # this test: a pod
    node = NodeProcesses(str(tmp_path), pod_uid_of_cgroups, clock=lambda: now[0])
    budget = Budget(HTTP, clock=lambda: now[0], node=node)
    origins = Origins(budget, node)
    budget.connection("127.0.0.1")
    for _ in range(int(HTTP.peer_burst + HTTP.probe_burst) + 1):
        budget.request("127.0.0.1", "/metrics")  # spent: contested
    node.scan(set())  # a scan this second already
    opened: list[socket.socket] = []
    try:
        overflowed: list[tuple[socket.socket, str]] = []
        for _ in range(MAX_WAITING + 4):
            socks, _ = connection()
            opened += socks
            assert origins.charge(socks[2], "127.0.0.1") is None  # waits for the scan
            overflowed += origins.overflow()
        assert [key for _, key in overflowed] == ["127.0.0.1"] * 4
        assert [sock for sock, _ in overflowed] == opened[2:12:3]  # the oldest four
        assert origins.due() == pytest.approx(101.0)  # the next scan
        assert origins.settle() == []  # not yet due
        now[0] += 1.0
        told = origins.settle()
        assert len(told) == MAX_WAITING and {key for _, key in told} == {"127.0.0.1"}
        assert origins.due() is None
    finally:
        for sock in opened:
            sock.close()
