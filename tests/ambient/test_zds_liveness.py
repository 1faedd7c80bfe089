"""The ZDS server's connection threads under liveness: one stuck in a turn past its heartbeat's
bound (here a snapshot source that does not return) fails /healthz naming `zds-connection` until
released; one busy sending a long snapshot, or idle between keepalive probes, stays live. A real
ZDS server on a real SOCK_SEQPACKET socket, spoken to by a minimal ztunnel (hello, then an ack for
each message); the clock is the test's (tests.liveness_rig). No root, no namespaces: the snapshot
pods have no netns, so they go as KeepWorkload."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.ambient import zds_pb2
from agent.ambient.dataplane import AmbientPod
from agent.ambient.zds import CONNECTION_NAME, ZdsServer, connection_heartbeat
from agent.ambient.zds_metrics import ZdsMetrics
from tests.liveness_rig import Probed, hangs_of, probed

IO_TIMEOUT = 2.0
KEEPALIVE = 0.05
BOUND = connection_heartbeat(IO_TIMEOUT, KEEPALIVE)


class Ztunnel:
    """The ztunnel end: says hello, then acks every message (calling `on_message` first)."""

    def __init__(self, path: str, on_message: Callable[[zds_pb2.WorkloadRequest], None]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.sock.send(zds_pb2.ZdsHello(version=zds_pb2.V1).SerializeToString())
        self.snapshot_sent = threading.Event()
        self._on_message = on_message
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 1024, 1)
            except OSError:
                return
            if not data:
                return
            for fd in fds:
                os.close(fd)
            message = zds_pb2.WorkloadRequest()
            message.ParseFromString(data)
            self._on_message(message)
            ack = zds_pb2.WorkloadResponse(ack=zds_pb2.Ack())
            self.sock.send(ack.SerializeToString())
            if message.HasField("snapshot_sent"):
                self.snapshot_sent.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the reader: a close alone would not
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(10)


def claimed(uid: str) -> AmbientPod:
    """A pod whose netns is unknown: sent as KeepWorkload."""
    return AmbientPod(
        uid=uid, name=uid, namespace="shop", service_account="sa", ips=(), netns_path=""
    )


@pytest.fixture
def rig() -> Iterator[Probed]:
    with probed() as rig:
        yield rig


@pytest.fixture
def server(rig: Probed, tmp_path: Path) -> Iterator[ZdsServer]:
    short = Path("/tmp") / f"zdslive-{os.getpid()}-{tmp_path.name[-12:]}"  # sun_path: 108 bytes
    server = ZdsServer(
        str(short / "ztunnel.sock"),
        metrics=ZdsMetrics(CollectorRegistry()),
        io_timeout=IO_TIMEOUT,
        keepalive_interval=KEEPALIVE,
        liveness=rig.liveness,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(short, ignore_errors=True)


def test_a_connection_stuck_in_a_turn_fails_healthz_naming_it_until_released(
    rig: Probed, server: ZdsServer
) -> None:
    entered, released = threading.Event(), threading.Event()

    def held_source() -> list[AmbientPod]:  # the hook: blocked as on a lock never released
        entered.set()
        released.wait(30)
        return [claimed("uid-1")]

    server.set_snapshot_source(held_source)
    before = hangs_of(CONNECTION_NAME)
    ztunnel = Ztunnel(server.socket_path, lambda _: None)
    try:
        assert entered.wait(10)
        rig.clock.now += BOUND - 1
        assert rig.healthz() == (200, "ok\n")
        rig.clock.now += 2
        status, text = rig.healthz()
        assert status == 503
        assert text.startswith(f"not live: {CONNECTION_NAME}\n{CONNECTION_NAME}: no turn for ")
        assert rig.healthz()[0] == 503
        assert hangs_of(CONNECTION_NAME) == before + 1
        released.set()
        assert ztunnel.snapshot_sent.wait(10)
        rig.wait_live("the connection live once it turned again")
    finally:
        released.set()
        ztunnel.close()


def test_a_connection_busy_with_a_long_snapshot_or_idle_stays_live(
    rig: Probed, server: ZdsServer
) -> None:
    seen: list[list[str]] = []

    def slow_ack(message: zds_pb2.WorkloadRequest) -> None:  # each ack well within the bound
        rig.clock.now += 0.6 * BOUND
        seen.append(rig.failing())

    server.set_snapshot_source(lambda: [claimed(f"uid-{i}") for i in range(5)])
    ztunnel = Ztunnel(server.socket_path, slow_ack)
    try:
        assert ztunnel.snapshot_sent.wait(10)
        assert seen == [[]] * 6  # five pods and SnapshotSent: 3.6 bounds, never stuck
        for _ in range(5):  # idle: the keepalive probes are its turns
            rig.clock.now += 0.6 * BOUND
            threading.Event().wait(5 * KEEPALIVE)
            assert CONNECTION_NAME not in rig.failing()
        assert rig.healthz() == (200, "ok\n")
    finally:
        ztunnel.close()
    rig.wait_live("an ended connection no longer judged")


@pytest.mark.timeout(30)
def test_stop_returns_within_its_bound_past_a_connection_stuck_in_a_turn(
    rig: Probed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    join = 0.5
    short = Path("/tmp") / f"zdsstop-{os.getpid()}-{tmp_path.name[-12:]}"
    server = ZdsServer(
        str(short / "ztunnel.sock"),
        metrics=ZdsMetrics(CollectorRegistry()),
        io_timeout=IO_TIMEOUT,
        keepalive_interval=KEEPALIVE,
        liveness=rig.liveness,
        join_timeout=join,
    )
    entered, released = threading.Event(), threading.Event()
    stuck: list[threading.Thread] = []

    def held_source() -> list[AmbientPod]:  # blocked as on a lock never released
        stuck.append(threading.current_thread())
        entered.set()
        released.wait(120)
        return []

    server.set_snapshot_source(held_source)
    server.start()
    ztunnel = Ztunnel(server.socket_path, lambda _: None)
    try:
        assert entered.wait(10)
        caplog.set_level(logging.WARNING)
        began = time.monotonic()
        server.stop()
        took = time.monotonic() - began
        assert took < join + 2.0, f"stop took {took:.1f} s"
        assert not os.path.exists(server.socket_path)
        assert stuck[0].is_alive() and stuck[0].daemon  # left behind, cannot hold the exit
        warnings = [r.getMessage() + repr(getattr(r, "fields", "")) for r in caplog.records]
        assert any("left running" in w and stuck[0].name in w for w in warnings), warnings
    finally:
        released.set()
        ztunnel.close()
        server.stop()
        shutil.rmtree(short, ignore_errors=True)
