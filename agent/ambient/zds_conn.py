"""One ztunnel connection of the ZDS server: the wire and the thread that owns it.

The wire is ztunnel's (Istio ztunnelserver_linux.go): a SOCK_SEQPACKET Unix socket, one protobuf
message per datagram, a pod's network namespace passed as an SCM_RIGHTS file descriptor beside
its AddWorkload. ztunnel opens with a ZdsHello; the agent then sends a snapshot (AddWorkload, or
KeepWorkload for a pod whose namespace it cannot open, each acknowledged) closed by SnapshotSent,
and from then on AddWorkload/DelWorkload as pods come and go.

ZDS matches an Ack to its request by order only, so one thread (the connection's own) reads and
writes the socket and one request is in flight at a time: callers queue a `Request` and wait on
its Future. Timeouts are Istio's: 5 s for the hello, each write and each ack; an idle connection
is probed every 5 s by a 10 ms read that must time out (ztunnel never speaks unasked).

One deliberate difference: when an ack does not come in time Istio keeps the connection, and the
late ack is then read as the answer to the next request (or as an unexpected message by the next
probe, which drops the connection). Here a missed ack ends the connection at once, so an ack is
never taken for another request's; ztunnel reconnects and gets a fresh snapshot.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError, Message

from agent.ambient import zds_pb2
from agent.errors import AgentError

log = logging.getLogger(__name__)

IO_TIMEOUT = 5.0
"""Istio's readWriteDeadline: hello, each write, each ack."""
KEEPALIVE_INTERVAL = 5.0
"""Istio's defaultZTunnelKeepAliveCheckInterval: idle time before probing the connection."""
ALIVE_PROBE = 0.01
"""Istio's CheckAlive read: a live, silent ztunnel makes it time out."""
MAX_MESSAGE = 1024
"""Istio's read buffer; a longer datagram is truncated and refused."""
PROTOCOL_VERSION = zds_pb2.V1

_ids = itertools.count(1)


class ConnectionClosed(AgentError):
    """The connection ended (or could not be written) before the request got its ack."""


class AckTimeout(AgentError):
    """ztunnel did not acknowledge in time; the connection is closed."""


class ProtocolError(AgentError):
    """ztunnel sent something the protocol does not allow at that point."""


class _Ended(Exception):
    """ztunnel closed the connection while idle: a normal end."""


@dataclass
class Request:
    """A message to send and wait for, with the netns descriptor it carries (owned: closed once
    sent or dropped, so a queued request never sends a descriptor someone else reused)."""

    message: zds_pb2.WorkloadRequest
    fd: int | None = None
    future: Future[zds_pb2.WorkloadResponse] = field(default_factory=Future)

    def close_fd(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


@dataclass
class SnapshotItem:
    """One pod of a snapshot: sent as AddWorkload with `fd`, or KeepWorkload when fd is None."""

    uid: str
    workload: zds_pb2.WorkloadInfo | None
    fd: int | None


class Wire:
    """Datagram I/O with Istio's deadlines. Only the connection's thread uses it."""

    def __init__(self, sock: socket.socket, io_timeout: float) -> None:
        self.sock = sock
        self.io_timeout = io_timeout

    def read_hello(self) -> zds_pb2.ZdsHello:
        hello = zds_pb2.ZdsHello()
        self._read(hello, "hello", self.io_timeout)
        if hello.version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"ztunnel hello has protocol version {_version_name(hello)}; "
                f"this agent speaks {zds_pb2.Version.Name(PROTOCOL_VERSION)}"
            )
        return hello

    def exchange(
        self, message: zds_pb2.WorkloadRequest, fd: int | None
    ) -> zds_pb2.WorkloadResponse:
        """Send `message` (with `fd` as SCM_RIGHTS) and read its ack."""
        ancillary = (
            []
            if fd is None
            else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
        )
        self.sock.settimeout(self.io_timeout)
        try:
            self.sock.sendmsg([message.SerializeToString()], ancillary, socket.MSG_NOSIGNAL)
        except TimeoutError as e:
            raise ConnectionClosed(f"write timed out after {self.io_timeout:g}s") from e
        except OSError as e:
            raise ConnectionClosed(f"write: {e.strerror or e}") from e
        response = zds_pb2.WorkloadResponse()
        self._read(response, "ack", self.io_timeout)
        return response

    def check_alive(self, probe: float) -> None:
        """Istio's CheckAlive: a read that must time out."""
        self.sock.settimeout(probe)
        try:
            data = self.sock.recv(MAX_MESSAGE)
        except TimeoutError:
            return
        if not data:
            raise _Ended("ztunnel closed the connection")
        raise ProtocolError("ztunnel sent a message that answers no request")

    def _read(self, into: Message, what: str, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data, _, flags, _ = self.sock.recvmsg(MAX_MESSAGE)
        except TimeoutError as e:
            raise AckTimeout(f"no {what} from ztunnel within {timeout:g}s") from e
        except OSError as e:
            raise ConnectionClosed(f"read {what}: {e.strerror or e}") from e
        if not data:
            raise ConnectionClosed(f"ztunnel closed the connection before its {what}")
        if flags & socket.MSG_TRUNC:
            raise ProtocolError(f"ztunnel's {what} is longer than {MAX_MESSAGE} bytes")
        try:
            into.ParseFromString(data)
        except DecodeError as e:
            raise ProtocolError(f"ztunnel's {what} is not a valid message: {e}") from e


def delete_request(uid: str) -> zds_pb2.WorkloadRequest:
    """A DelWorkload request (`del` is a Python keyword: the field is reached by name)."""
    message = zds_pb2.WorkloadRequest()
    deleted = getattr(message, "del")
    deleted.SetInParent()
    deleted.uid = uid
    return message


def _version_name(hello: zds_pb2.ZdsHello) -> str:
    try:
        return zds_pb2.Version.Name(hello.version)
    except ValueError:
        return str(int(hello.version))


class Connection:
    """A connected ztunnel: greets, sends the snapshot, then serves queued requests."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        snapshot: Callable[[], list[SnapshotItem]],
        io_timeout: float = IO_TIMEOUT,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
        beat: Callable[[], None] = lambda: None,
    ) -> None:
        """`beat`: called at each turn of the connection's thread (its liveness heartbeat)."""
        self.id = f"zds-{next(_ids)}"
        self._beat = beat
        self.greeted = threading.Event()
        """ztunnel's hello was valid: requests queued from now on follow the snapshot."""
        self.synced = threading.Event()
        """ztunnel acknowledged SnapshotSent."""
        self._wire = Wire(sock, io_timeout)
        self._snapshot = snapshot
        self._keepalive = keepalive_interval
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, message: zds_pb2.WorkloadRequest, fd: int | None = None) -> Request:
        """Queue a request (taking ownership of `fd`); raises ConnectionClosed when ended."""
        request = Request(message, fd)
        with self._lock:
            if self._closed:
                request.close_fd()
                raise ConnectionClosed(f"ztunnel connection {self.id} is closed")
            self._queue.put(request)
        return request

    def close(self) -> None:
        """End the connection from another thread (agent stop)."""
        with self._lock:
            self._closed = True
        self._queue.put(None)
        with contextlib.suppress(OSError):
            self._wire.sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        """The connection's thread: returns when the connection has ended."""
        fields = {"conn": self.id}
        try:
            hello = self._wire.read_hello()
            self._beat()
            self.greeted.set()
            log.info(
                "ztunnel said hello",
                extra={"fields": {**fields, "version": zds_pb2.Version.Name(hello.version)}},
            )
            self._send_snapshot()
            self.synced.set()
            log.info("snapshot sent to ztunnel", extra={"fields": fields})
            self._serve()
        except _Ended:
            log.info("ztunnel disconnected", extra={"fields": fields})
        except (ConnectionClosed, AckTimeout, ProtocolError, OSError) as e:
            if self._closed:
                log.info("ztunnel connection closed", extra={"fields": fields})
            elif isinstance(e, ConnectionClosed) and not self.greeted.is_set():
                # Not a ztunnel that failed: a peer that left without a word (or a flood).
                log.info("ZDS peer left before its hello", extra={"fields": fields})
            else:
                log.error("ztunnel connection dropped: %s", e, extra={"fields": fields})
        except Exception:  # a bug or a failed snapshot source: never a half-sent snapshot
            log.exception("ztunnel connection failed", extra={"fields": fields})
        finally:
            self._end()

    def _send_snapshot(self) -> None:
        items = self._snapshot()
        try:
            for item in items:
                self._beat()
                if item.fd is not None:
                    message = zds_pb2.WorkloadRequest(
                        add=zds_pb2.AddWorkload(uid=item.uid, workload_info=item.workload)
                    )
                else:  # namespace not found: ztunnel keeps what it has for this pod
                    message = zds_pb2.WorkloadRequest(keep=zds_pb2.KeepWorkload(uid=item.uid))
                ack = self._wire.exchange(message, item.fd)
                if ack.ack.error:
                    log.error(
                        "ztunnel refused a snapshot pod: %s",
                        ack.ack.error,
                        extra={"fields": {"conn": self.id, "uid": item.uid}},
                    )
        finally:
            for item in items:
                if item.fd is not None:
                    os.close(item.fd)
        self._beat()
        ack = self._wire.exchange(
            zds_pb2.WorkloadRequest(snapshot_sent=zds_pb2.SnapshotSent()), None
        )
        if ack.ack.error:
            log.error(
                "ztunnel answered SnapshotSent with an error: %s",
                ack.ack.error,
                extra={"fields": {"conn": self.id}},
            )

    def _serve(self) -> None:
        while True:
            self._beat()
            try:
                request = self._queue.get(timeout=self._keepalive)
            except queue.Empty:
                self._wire.check_alive(ALIVE_PROBE)
                continue
            if request is None:
                return
            self._process(request)

    def _process(self, request: Request) -> None:
        try:
            if not request.future.set_running_or_notify_cancel():
                return  # the caller gave up waiting before it was sent
            try:
                response = self._wire.exchange(request.message, request.fd)
            except BaseException as e:
                request.future.set_exception(e)
                raise
            request.future.set_result(response)
        finally:
            request.close_fd()

    def _end(self) -> None:
        with self._lock:
            self._closed = True
        for request in self._drain():
            if request.future.set_running_or_notify_cancel():
                request.future.set_exception(
                    ConnectionClosed(f"ztunnel connection {self.id} ended before the ack")
                )
            request.close_fd()
        with contextlib.suppress(OSError):
            self._wire.sock.close()

    def _drain(self) -> Iterator[Request]:
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                yield request
