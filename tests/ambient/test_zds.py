"""The ZDS server (agent.ambient.zds) against the ztunnel test double over a real socket, with
real network namespaces: Istio's protocol (ztunnelserver_linux_test.go) and what ztunnel then
does with each pod's namespace descriptor."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.ambient import zds_pb2
from agent.ambient.dataplane import AmbientPod
from agent.ambient.zds import MAX_CONNECTIONS as ZDS_CAP
from agent.ambient.zds import ZdsServer
from agent.ambient.zds_metrics import ZdsMetrics
from agent.errors import ZdsServerError, ZtunnelError, ZtunnelNotConnected
from agent.netns import run_in_netns
from agent.socket_keeper import KEEP_SECONDS
from testbed import netns
from testbed.wait import wait_for
from testbed.zds_checks import PodIdentity
from testbed.ztunnel_double import DNS_PORT, TCP_PORTS, ZtunnelDouble, kept_connected

pytestmark = pytest.mark.ambient

IO_TIMEOUT = 0.5  # Istio's 5 s, shortened so timeout cases stay quick
KEEPALIVE = 0.2


class Bed:
    """A started ZDS server, its metrics, and helpers to make pods and ztunnels."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket_path = str(tmp_path / "run" / "ztunnel" / "ztunnel.sock")
        self.registry = CollectorRegistry()
        self.server = ZdsServer(
            self.socket_path,
            metrics=ZdsMetrics(self.registry),
            io_timeout=IO_TIMEOUT,
            keepalive_interval=KEEPALIVE,
        )
        self.namespaces: list[str] = []
        self.doubles: list[ZtunnelDouble] = []
        self.pods: list[PodIdentity] = []
        """Every pod made: each double checks each WorkloadInfo against them."""

    def pod(self, name: str) -> AmbientPod:
        """A pod with its own, real network namespace (deleted after the test)."""
        ns = netns.unique_name(f"zds-{name}")
        path = netns.add(ns)
        self.namespaces.append(ns)
        identity = PodIdentity(f"uid-{name}", name, "shop", f"sa-{name}")
        self.pods.append(identity)
        for double in self.doubles:
            double.tell(identity)
        return AmbientPod(
            uid=identity.uid,
            name=name,
            namespace="shop",
            service_account=identity.service_account,
            ips=("10.0.0.9",),
            netns_path=str(path),
        )

    def ztunnel(self, hello_version: int = zds_pb2.V1) -> ZtunnelDouble:
        double = ZtunnelDouble(self.socket_path, hello_version=hello_version)
        double.tell(*self.pods)
        self.doubles.append(double)
        return double

    def connected_ztunnel(self, *, holding: tuple[str, ...] = ()) -> ZtunnelDouble:
        """A ztunnel that connects; `holding`: pods it held before (the agent restarted)."""
        double = self.ztunnel()
        double.hold(*holding)
        double.connect()
        double.wait_for("the snapshot", lambda z: z.snapshots == 1)
        wait_for(lambda: self.server.connected, "the agent to see the snapshot acked", 10)
        return double

    def gauge(self) -> float | None:
        return self.registry.get_sample_value("ztunnel_connected")

    def wait_gauge(self, value: float) -> None:
        wait_for(
            lambda: self.gauge() == value,
            f"ztunnel_connected to be {value}",
            10,
            interval=0.02,
            on_timeout=lambda: f"it is {self.gauge()}",
        )

    def close(self) -> None:
        """Everything goes; then each double's violations, if any, fail the test."""
        try:
            for double in self.doubles:
                double.strict = False
                double.close()
            self.server.stop()
        finally:
            for ns in self.namespaces:
                netns.delete(ns)
        for double in self.doubles:
            double.assert_no_violations()


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    bed = Bed(tmp_path)
    bed.server.start()
    try:
        yield bed
    finally:
        bed.close()


def tcp_in(pod: AmbientPod, port: int, host: str = "127.0.0.1") -> str:
    """Connect from inside the pod's namespace; what the other end said, or the error's name."""

    def call() -> str:
        try:
            with socket.create_connection((host, port), timeout=2) as conn:
                return conn.recv(256).decode()
        except OSError as e:
            return f"error|{type(e).__name__}"

    return run_in_netns(pod.netns_path, call)


def udp_in(pod: AmbientPod, port: int, payload: bytes) -> bytes:
    def call() -> bytes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(2)
            sock.sendto(payload, ("127.0.0.1", port))
            return sock.recv(512)

    return run_in_netns(pod.netns_path, call)


def kinds(double: ZtunnelDouble) -> list[tuple[str, str, bool]]:
    return list(double.requests)


# --- the socket


def test_socket_is_seqpacket_0600_replaces_a_stale_one_and_goes_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "ztunnel" / "ztunnel.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    stale_inode = path.lstat().st_ino
    server = ZdsServer(str(path), metrics=ZdsMetrics(CollectorRegistry()))
    assert not server.ready()
    server.start()
    try:
        mode = path.lstat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        assert path.lstat().st_ino != stale_inode
        assert server.ready()
        # A stream client cannot reach a SEQPACKET socket.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wrong, pytest.raises(OSError):
            wrong.connect(str(path))
    finally:
        server.stop()
    assert not path.exists()
    assert not server.ready()


def test_the_older_agent_takes_the_socket_back_when_the_newer_leaves(tmp_path: Path) -> None:
    """A rolled-back surge: the newer agent's ZDS server takes the path, then stops and removes
    it; the older one binds it again (its accept loop looks every KEEP_SECONDS), so ztunnel can
    connect. A socket the newer one serves is left to it meanwhile."""
    path = tmp_path / "ztunnel.sock"
    old = ZdsServer(str(path), metrics=ZdsMetrics(CollectorRegistry()))
    new = ZdsServer(str(path), metrics=ZdsMetrics(CollectorRegistry()))
    old.start()
    try:
        new.start()
        taken = path.lstat().st_ino
        time.sleep(KEEP_SECONDS + 0.5)
        assert path.lstat().st_ino == taken  # served by the newer: left alone
        new.stop()
        assert not path.exists()
        wait_for(path.exists, "the older server to bind the path again", 3 * KEEP_SECONDS)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as ztunnel:
            ztunnel.connect(str(path))  # accepted: a listener is there
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    finally:
        new.stop()
        old.stop()
    assert not path.exists()


def test_socket_dir_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "ztunnel.sock"
    server = ZdsServer(str(path), metrics=ZdsMetrics(CollectorRegistry()))
    server.start()
    try:
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        server.stop()


def test_a_file_in_the_way_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ztunnel.sock"
    path.write_text("not a socket")
    server = ZdsServer(str(path), metrics=ZdsMetrics(CollectorRegistry()))
    with pytest.raises(ZdsServerError, match=f"{path}: a regular file is in the way"):
        server.start()
    assert path.read_text() == "not a socket"
    assert not server.ready()


# --- snapshot, add, delete


def test_snapshot_on_connect_carries_pods_added_while_away(bed: Bed) -> None:
    first, second, from_source = bed.pod("first"), bed.pod("second"), bed.pod("restored")
    gone = AmbientPod(
        uid="uid-gone",
        name="gone",
        namespace="shop",
        service_account="sa",
        ips=(),
        netns_path="/run/netns/zds-does-not-exist",
    )
    bed.server.set_snapshot_source(lambda: [from_source, gone])
    for pod in (first, second):
        with pytest.raises(ZtunnelNotConnected, match=f"shop/{pod.name}"):
            bed.server.add(pod)
    assert not bed.server.connected and bed.gauge() == 0

    ztunnel = bed.connected_ztunnel(holding=("uid-gone",))  # the agent restarted, not ztunnel

    requests = kinds(ztunnel)
    assert sorted(requests[:-1]) == [
        ("add", "uid-first", True),
        ("add", "uid-restored", True),
        ("add", "uid-second", True),
        ("keep", "uid-gone", False),
    ]
    assert requests[-1] == ("snapshot_sent", "", False)
    workloads = ztunnel.workloads()
    assert set(workloads) == {"uid-first", "uid-second", "uid-restored"}
    for pod in (first, second, from_source):
        held = workloads[pod.uid]
        assert (held.name, held.namespace, held.service_account) == (
            pod.name,
            "shop",
            f"sa-{pod.name}",
        )
        assert held.netns_inode == os.stat(pod.netns_path).st_ino  # that pod's namespace
    assert bed.server.connected and bed.gauge() == 1


def test_add_hands_ztunnel_the_pods_real_namespace(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    pod, other = bed.pod("web"), bed.pod("db")
    bed.server.add(pod)
    bed.server.add(other)

    assert kinds(ztunnel)[-2:] == [("add", "uid-web", True), ("add", "uid-db", True)]
    for port in TCP_PORTS:  # the same ports in two pods: each listener is in its own netns
        assert tcp_in(pod, port) == f"ztunnel-double|uid-web|{port}"
        assert tcp_in(other, port) == f"ztunnel-double|uid-db|{port}"
    accepted = ztunnel.workloads()["uid-web"].accepted
    assert [(a.port, a.local) for a in accepted] == [(p, f"127.0.0.1:{p}") for p in TCP_PORTS]
    assert udp_in(pod, DNS_PORT, b"dns?") == b"dns?"
    assert tcp_in(pod, DNS_PORT) == f"ztunnel-double|uid-web|{DNS_PORT}"
    assert b"dns?" in [data for _, data in ztunnel.workloads()["uid-web"].dns]
    # Nothing of it in the test's own namespace.
    with socket.socket() as probe:
        probe.settimeout(1)
        try:
            probe.connect(("127.0.0.1", TCP_PORTS[0]))
            said = probe.recv(64).decode()
        except OSError:
            said = ""
    assert not said.startswith("ztunnel-double")
    assert len(ztunnel.workloads()["uid-web"].accepted) == len(TCP_PORTS)


def test_ack_error_surfaces_as_ztunnel_error_and_the_pod_stays_known(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    pod = bed.pod("refused")
    ztunnel.refuse[pod.uid] = "no certificate for sa-refused"
    with pytest.raises(ZtunnelError, match=r"shop/refused.*no certificate for sa-refused") as e:
        bed.server.add(pod)
    assert not isinstance(e.value, ZtunnelNotConnected)
    assert bed.server.connected  # an ack error does not end the connection
    # Istio keeps the pod (partial add): the next ztunnel gets it in its snapshot.
    del ztunnel.refuse[pod.uid]
    ztunnel.restart()
    ztunnel.wait_for("the second snapshot", lambda z: z.snapshots == 2)
    assert pod.uid in ztunnel.workloads()


def test_pod_added_while_away_is_delivered_when_ztunnel_connects(bed: Bed) -> None:
    pod = bed.pod("early")
    with pytest.raises(ZtunnelNotConnected):
        bed.server.add(pod)
    assert tcp_in(pod, TCP_PORTS[0]) == "error|ConnectionRefusedError"
    bed.connected_ztunnel()
    assert tcp_in(pod, TCP_PORTS[0]) == f"ztunnel-double|uid-early|{TCP_PORTS[0]}"


def test_remove_sends_del_and_ztunnel_lets_go(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    pod = bed.pod("leaving")
    bed.server.add(pod)
    assert tcp_in(pod, TCP_PORTS[1]).startswith("ztunnel-double|uid-leaving")
    bed.server.remove(pod.uid)
    assert kinds(ztunnel)[-1] == ("del", "uid-leaving", False)
    assert pod.uid not in ztunnel.workloads()
    assert tcp_in(pod, TCP_PORTS[1]) == "error|ConnectionRefusedError"
    bed.server.remove("uid-never-added")  # ztunnel acks an unknown uid; no error
    assert kinds(ztunnel)[-1] == ("del", "uid-never-added", False)


def test_ztunnel_restart_gets_a_fresh_snapshot_without_deleted_pods(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    kept, deleted = bed.pod("kept"), bed.pod("deleted")
    bed.server.add(kept)
    bed.server.add(deleted)
    ztunnel.restart()
    ztunnel.wait_for("snapshot 2", lambda z: z.snapshots == 2)
    assert set(ztunnel.workloads()) == {"uid-kept", "uid-deleted"}
    bed.server.remove(deleted.uid)
    ztunnel.restart()
    ztunnel.wait_for("snapshot 3", lambda z: z.snapshots == 3)
    after_restart = kinds(ztunnel)[-2:]
    assert after_restart == [("add", "uid-kept", True), ("snapshot_sent", "", False)]
    assert set(ztunnel.workloads()) == {"uid-kept"}
    assert tcp_in(kept, TCP_PORTS[0]).startswith("ztunnel-double|uid-kept")
    assert tcp_in(deleted, TCP_PORTS[0]) == "error|ConnectionRefusedError"
    bed.wait_gauge(1)


def test_pod_deleted_while_ztunnel_is_away_is_not_in_the_next_snapshot(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    stays, goes = bed.pod("stays"), bed.pod("goes")
    bed.server.add(stays)
    bed.server.add(goes)
    ztunnel.disconnect()  # ztunnel lost its socket but still holds both pods
    bed.wait_gauge(0)
    assert not bed.server.connected
    sent_before = len(ztunnel.requests)
    bed.server.remove(goes.uid)  # nobody to tell: just forgotten
    assert len(ztunnel.requests) == sent_before
    ztunnel.connect()
    ztunnel.wait_for("snapshot 2", lambda z: z.snapshots == 2)
    assert kinds(ztunnel)[sent_before:] == [
        ("add", "uid-stays", True),
        ("snapshot_sent", "", False),
    ]
    # ztunnel reconciles on SnapshotSent: the pod it still had is dropped.
    assert set(ztunnel.workloads()) == {"uid-stays"}
    assert tcp_in(goes, TCP_PORTS[2]) == "error|ConnectionRefusedError"


def test_adds_go_to_the_newest_ztunnel_deletes_to_all(bed: Bed) -> None:
    old = bed.connected_ztunnel()
    new = bed.connected_ztunnel()
    bed.wait_gauge(2)
    pod = bed.pod("rollout")
    bed.server.add(pod)
    assert ("add", "uid-rollout", True) in kinds(new)
    assert ("add", "uid-rollout", True) not in kinds(old)
    bed.server.remove(pod.uid)
    assert kinds(new)[-1] == ("del", "uid-rollout", False)
    assert kinds(old)[-1] == ("del", "uid-rollout", False)
    new.disconnect()
    bed.wait_gauge(1)
    bed.server.add(pod)  # the newest left: the previous one takes adds again
    assert kinds(old)[-1] == ("add", "uid-rollout", True)


def test_one_request_in_flight(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    ztunnel.ack_delay = 0.05
    pods = [bed.pod(f"p{i}") for i in range(5)]
    errors: list[BaseException] = []

    def add(pod: AmbientPod) -> None:
        try:
            bed.server.add(pod)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(pod,)) for pod in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert set(ztunnel.workloads()) == {pod.uid for pod in pods}
    assert ztunnel.overlapped == 0


# --- refusals and timeouts


@pytest.mark.parametrize("version", [2, zds_pb2.NOT_USED], ids=["v2", "not-used"])
def test_hello_with_another_version_is_refused(bed: Bed, version: int) -> None:
    pod = bed.pod("waiting")
    with pytest.raises(ZtunnelNotConnected):
        bed.server.add(pod)
    stranger = bed.ztunnel(hello_version=version)
    stranger.connect()
    stranger.wait_disconnected()
    assert stranger.requests == []  # not even the snapshot
    assert not bed.server.connected
    bed.wait_gauge(0)
    bed.connected_ztunnel()  # a V1 ztunnel still gets everything
    assert bed.server.connected


def test_silent_client_is_dropped_after_the_hello_timeout(bed: Bed) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect(bed.socket_path)
        silent.settimeout(IO_TIMEOUT * 6)
        started = time.monotonic()
        assert silent.recv(64) == b""  # the agent hung up
        assert IO_TIMEOUT * 0.8 <= time.monotonic() - started < IO_TIMEOUT * 6
    bed.wait_gauge(0)


def test_no_ack_in_time_is_a_ztunnel_error_and_ends_the_connection(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    ztunnel.ack_delay = IO_TIMEOUT * 3
    pod = bed.pod("slow")
    started = time.monotonic()
    with pytest.raises(ZtunnelError, match=r"shop/slow.*no ack from ztunnel within") as e:
        bed.server.add(pod)
    assert not isinstance(e.value, ZtunnelNotConnected)
    assert time.monotonic() - started < IO_TIMEOUT * 3
    bed.wait_gauge(0)  # a late ack would be taken for the next request's: connection dropped
    ztunnel.wait_disconnected()
    ztunnel.ack_delay = 0
    ztunnel.connect()  # reconnects and is given the pod in its snapshot
    ztunnel.wait_for("snapshot 2", lambda z: z.snapshots == 2)
    assert pod.uid in ztunnel.workloads()


def test_unasked_message_drops_the_connection(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    ztunnel.send_unasked()
    ztunnel.wait_disconnected()
    bed.wait_gauge(0)


def test_a_kept_double_is_back_with_a_snapshot_when_the_agent_drops_it(bed: Bed) -> None:
    """testbed.ztunnel_double.kept_connected: as ztunnel, the double connects again once the
    agent ended its connection, and gets a fresh snapshot holding the pods added meanwhile."""
    ztunnel = bed.connected_ztunnel()
    with kept_connected(ztunnel, interval=0.05) as reconnected:
        ztunnel.send_unasked()  # a protocol error: the agent ends the connection
        wait_for(lambda: reconnected, "the double to connect again", 10)
        ztunnel.wait_for("a second snapshot", lambda z: z.snapshots == 2)
        pod = bed.pod("after")
        bed.server.add(pod)
        ztunnel.wait_for("the pod added after", lambda z: pod.uid in z.workloads())
    assert len(reconnected) == 1 and ztunnel.connections == 2


def test_stop_closes_connections_and_forgets_pods(bed: Bed) -> None:
    ztunnel = bed.connected_ztunnel()
    bed.server.add(bed.pod("last"))
    bed.server.stop()
    ztunnel.wait_disconnected()
    assert bed.gauge() == 0
    assert not os.path.exists(bed.socket_path)


def test_failing_snapshot_source_sends_no_partial_snapshot(bed: Bed) -> None:
    pod = bed.pod("known")
    with pytest.raises(ZtunnelNotConnected):
        bed.server.add(pod)

    def broken() -> list[AmbientPod]:
        raise RuntimeError("pod cache not synced")

    bed.server.set_snapshot_source(broken)
    ztunnel = bed.ztunnel()
    ztunnel.connect()
    ztunnel.wait_disconnected()
    # A SnapshotSent after a partial list would make ztunnel drop the pods left out.
    assert ztunnel.requests == [] and ztunnel.snapshots == 0
    assert not bed.server.connected


def test_no_descriptor_outlives_its_pod(tmp_path: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    bed = Bed(tmp_path)
    pods = [bed.pod("a"), bed.pod("b")]
    before = open_fds()
    bed.server.start()
    try:
        with pytest.raises(ZtunnelNotConnected):
            bed.server.add(pods[0])
        ztunnel = bed.connected_ztunnel()
        bed.server.add(pods[1])
        ztunnel.restart()
        ztunnel.wait_for("snapshot 2", lambda z: z.snapshots == 2)
        bed.server.remove(pods[0].uid)
        ztunnel.close()
        bed.server.stop()
        wait_for(
            lambda: open_fds() == before,
            f"{before} open descriptors",
            10,
            on_timeout=lambda: f"now {open_fds()}",
        )
    finally:
        bed.close()


def silent_connection(path: str) -> socket.socket:
    """A peer that connects to the ZDS socket and never says hello."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(path)
    return sock


def closed_by_agent(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(64) == b""
    except TimeoutError:
        return False


def test_over_the_cap_silent_connections_go_first_and_ztunnel_stays(bed: Bed) -> None:
    double = bed.connected_ztunnel()
    silent = [silent_connection(bed.socket_path) for _ in range(ZDS_CAP - 1)]
    try:
        bed.wait_gauge(ZDS_CAP)
        newcomer = silent_connection(bed.socket_path)
        silent.append(newcomer)
        assert closed_by_agent(silent[0])  # the oldest without a hello made room
        bed.wait_gauge(ZDS_CAP)
        assert double.connected and bed.server.connected
        pod = bed.pod("after-flood")
        bed.server.add(pod)  # the working ztunnel still gets pods
        double.wait_for("the pod", lambda z: pod.uid in z.workloads())
        assert not closed_by_agent(newcomer, timeout=0.2)
    finally:
        for sock in silent:
            sock.close()


def test_a_newcomer_is_refused_when_every_connection_said_hello(bed: Bed) -> None:
    doubles = [bed.connected_ztunnel() for _ in range(ZDS_CAP)]
    extra = silent_connection(bed.socket_path)
    try:
        assert closed_by_agent(extra)
        bed.wait_gauge(ZDS_CAP)
        assert all(d.connected for d in doubles)
    finally:
        extra.close()
