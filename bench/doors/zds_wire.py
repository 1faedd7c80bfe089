"""The ZDS socket as ztunnel's end speaks it: a connection (agent.ambient.zds_conn.Connection)
greets, sends a two-pod snapshot (one AddWorkload with a namespace descriptor, one KeepWorkload),
SnapshotSent, then two queued DelWorkloads, while the peer's datagrams (hello, acks, and
anything else, some carrying descriptors) come from the fuzzer.

Contract: the connection ends only through its protocol errors (closed, ack timeout, protocol
error), never the catch-all for a bug; every request gets an answer or an exception; no
descriptor is kept (the process's open descriptors do not grow)."""

from __future__ import annotations

import array
import logging
import os
import socket

import atheris

from agent.ambient import zds_conn, zds_pb2
from bench.doors.finding import Finding

IO_TIMEOUT = 0.005
FD_CHECK_EVERY = 200
SEEDS = [
    zds_pb2.ZdsHello(version=zds_pb2.V1).SerializeToString()
    + b"\xff"
    + zds_pb2.WorkloadResponse(ack=zds_pb2.Ack()).SerializeToString()
    + b"\xff"
    + zds_pb2.WorkloadResponse(ack=zds_pb2.Ack(error="no such pod")).SerializeToString(),
    zds_pb2.ZdsHello(version=zds_pb2.NOT_USED).SerializeToString(),
    b"\x08\x01\xff\x0a\x00\xff\x0a\x00\xff\x0a\x00\xff\x0a\x00\xff\x0a\x00",
]


class _Failures(logging.Handler):
    """Records the connection's catch-all ("ztunnel connection failed": a bug)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.bugs: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.getMessage() == "ztunnel connection failed":
            self.bugs.append(self.format(record))


_failures = _Failures()
_runs = 0
_baseline_fds = 0


def setup() -> None:
    global _baseline_fds
    logger = logging.getLogger(zds_conn.__name__)
    logger.addHandler(_failures)
    logger.propagate = False
    logger.setLevel(logging.ERROR)
    _baseline_fds = _open_fds()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _snapshot() -> list[zds_conn.SnapshotItem]:
    workload = zds_pb2.WorkloadInfo(name="p", namespace="ns", service_account="sa")
    return [
        zds_conn.SnapshotItem("uid-1", workload, os.open("/dev/null", os.O_RDONLY)),
        zds_conn.SnapshotItem("uid-2", None, None),
    ]


def _send(peer: socket.socket, datagrams: list[bytes], with_fd: list[bool]) -> None:
    for data, fd in zip(datagrams, with_fd, strict=True):
        ancillary = []
        if fd:
            spare = os.open("/dev/null", os.O_RDONLY)
            ancillary = [
                (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [spare]).tobytes())
            ]
            try:
                peer.sendmsg([data], ancillary)
            finally:
                os.close(spare)
        else:
            peer.sendmsg([data])


def teardown() -> None:
    pass


def one_input(data: bytes) -> None:
    global _runs
    fdp = atheris.FuzzedDataProvider(data)
    close_after = fdp.ConsumeBool()
    datagrams = fdp.ConsumeBytes(fdp.remaining_bytes()).split(b"\xff")[:8]
    with_fd = [len(d) % 3 == 1 for d in datagrams]
    agent_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _send(peer, datagrams, with_fd)
        if close_after:
            peer.shutdown(socket.SHUT_WR)
        conn = zds_conn.Connection(agent_end, snapshot=_snapshot, io_timeout=IO_TIMEOUT)
        requests = [conn.submit(zds_conn.delete_request(f"uid-{i}")) for i in (3, 4)]
        conn._queue.put(None)  # serve the two, then return
        conn.run()
    finally:
        peer.close()
        agent_end.close()
    if _failures.bugs:
        bug, _failures.bugs[:] = _failures.bugs[0], []
        raise Finding(f"the connection's catch-all ran: {bug}")
    for request in requests:
        if not request.future.done():
            raise Finding("a request was left without an answer or an error")
    _runs += 1
    if _runs % FD_CHECK_EVERY == 0 and _open_fds() > _baseline_fds + 8:
        raise Finding(f"descriptors grow: {_open_fds()} open, {_baseline_fds} at start")
