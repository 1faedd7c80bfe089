"""A ztunnel TEST DOUBLE: ztunnel itself cannot run here, so this stands in for it on the ZDS
socket. It is not ztunnel and proxies nothing.

It speaks ztunnel's side of ZDS (connect, ZdsHello, an Ack for every request) with the messages
generated from Istio's zds.proto, the same ones the agent uses, and keeps a table of workloads
as ztunnel does: AddWorkload adds, DelWorkload removes, and SnapshotSent drops every workload the
snapshot did not name (Add or Keep). For each AddWorkload it enters the network namespace whose
descriptor came with the message (setns in a short-lived thread) and opens real listeners there
on ztunnel's in-pod ports: TCP 15001 (outbound), 15006 (inbound), 15008 (HBONE), and DNS on
127.0.0.1:15053 (TCP and UDP). The TCP listeners are transparent (IP_TRANSPARENT), as ztunnel's
are, so TPROXY can deliver to them. Each listener records what it accepted (peer, local address,
SO_ORIGINAL_DST) and answers `ztunnel-double|<uid>|<port>`, so a test proves that traffic was
captured into this pod's "ztunnel". DelWorkload closes them.

For failure cases it can refuse pods (Ack with an error), delay its acks, send an unasked
message, say hello with another version, disconnect, and restart (a new process: empty table,
listeners gone, then a fresh connection).

It is strict by default: every message is checked as ztunnel would check it
(testbed.zds_checks: order, each WorkloadInfo against the pod, the descriptor a network
namespace, KeepWorkload only for pods it holds, no re-add of a deleted pod's same sandbox), each
violation recorded in `violations`, and `close` (so the end of `with`, every fixture's teardown)
fails the test when there is any. Tell it the pods (`tell`), or, where an API server runs, give
it `identity` (`api_identity`) to compare each WorkloadInfo with the API server's pod.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import ctypes.util
import os
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from agent.ambient import zds_pb2
from testbed.zds_checks import IdentityLookup, PodIdentity, ZdsChecks

OUTBOUND_PORT = 15001
INBOUND_PORT = 15006
HBONE_PORT = 15008
DNS_PORT = 15053
TCP_PORTS = (OUTBOUND_PORT, INBOUND_PORT, HBONE_PORT)

CLONE_NEWNET = 0x40000000
IP_TRANSPARENT = 19  # <linux/in.h>
IPV6_TRANSPARENT = 75  # <linux/in6.h>
SO_ORIGINAL_DST = 80  # <linux/netfilter_ipv4.h>; IP6T_SO_ORIGINAL_DST has the same number
SO_NETNS_COOKIE = 71  # <asm-generic/socket.h>, Linux 5.14
POLL = 0.1  # how often listener threads look for close()

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
T = TypeVar("T")


@dataclass(frozen=True)
class Accepted:
    """A connection a listener accepted."""

    port: int
    peer: str
    local: str
    original_dst: str | None
    """SO_ORIGINAL_DST (IP6T_SO_ORIGINAL_DST for IPv6): the destination before a REDIRECT, the
    local address when conntrack saw the connection un-NATed; None without a conntrack entry."""


@dataclass
class Workload:
    uid: str
    name: str
    namespace: str
    service_account: str
    netns_inode: int
    """Inode of the namespace the agent's descriptor referred to (compare with the pod's)."""
    accepted: list[Accepted] = field(default_factory=list)
    dns: list[tuple[str, bytes]] = field(default_factory=list)
    """(peer, payload) of each DNS datagram or TCP DNS connection's first read."""
    sockets: list[socket.socket] = field(default_factory=list, repr=False)
    threads: list[threading.Thread] = field(default_factory=list, repr=False)
    closing: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass(frozen=True)
class Message:
    """One request of the agent's stream, as received (`stream`), or `hello` for the start of a
    connection (ztunnel's hello: the agent's stream begins anew after it)."""

    connection: int
    kind: str
    """hello, add, keep, del or snapshot_sent."""
    uid: str = ""
    info: tuple[str, str, str] | None = None
    """An AddWorkload's WorkloadInfo: (name, namespace, service account)."""
    fds: int = 0
    netns_inode: int | None = None
    """Inode of the namespace at the first descriptor (an AddWorkload's pod netns)."""
    netns: str = ""
    """What `netns_name` made of that descriptor when it came (e.g. the runtime's netns file)."""


class ZtunnelDouble:
    """The test double; use as a context manager so listeners and threads always go away."""

    def __init__(
        self,
        socket_path: str,
        *,
        hello_version: int = zds_pb2.V1,
        dns: bool = True,
        strict: bool = True,
        identity: IdentityLookup | None = None,
        netns_name: Callable[[int], str] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.netns_name = netns_name
        self.strict = strict
        self.checks = ZdsChecks(lookup=identity, cookie=netns_cookie, redirects=redirects)
        self.hello_version = hello_version
        self.dns = dns
        self.refuse: dict[str, str] = {}
        """uid -> error text of the Ack for that pod's AddWorkload."""
        self.ack_delay = 0.0
        """Seconds to wait before each ack."""
        self.requests: list[tuple[str, str, bool]] = []
        """Every request received, in order: (kind, uid, came with a descriptor)."""
        self.snapshots = 0
        """SnapshotSent messages received (over all connections)."""
        self.connections = 0
        self.stream: list[Message] = []
        """Every hello and request of every connection, in order (for comparing two agents)."""
        self.overlapped = 0
        """Requests that arrived before the previous one was acked (ZDS allows one in flight)."""
        self._workloads: dict[str, Workload] = {}
        self._lock = threading.Condition()
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._closing = threading.Event()
        self._in_snapshot: set[str] | None = None

    # --- what tests look at

    @property
    def violations(self) -> list[str]:
        """What the agent sent that ztunnel would not take (testbed.zds_checks)."""
        return list(self.checks.violations)

    def tell(self, *pods: PodIdentity) -> None:
        """The pods the agent may send: each WorkloadInfo must be its pod's."""
        self.checks.tell(*pods)

    def hold(self, *uids: str) -> None:
        """Pods this ztunnel holds from before (the agent restarted, it did not)."""
        self.checks.hold(*uids)

    def assert_no_violations(self) -> None:
        if self.checks.violations:
            raise AssertionError(
                "ztunnel test double: the agent sent what ztunnel would not take:\n  "
                + "\n  ".join(self.checks.violations)
            )

    def workloads(self) -> dict[str, Workload]:
        with self._lock:
            return dict(self._workloads)

    @property
    def connected(self) -> bool:
        return self._reader is not None and self._reader.is_alive()

    def wait_for(
        self, what: str, predicate: Callable[[ZtunnelDouble], T], timeout: float = 10.0
    ) -> T:
        """Wait until predicate(self) is truthy; fail naming `what` otherwise."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                value = predicate(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"ztunnel test double: timed out waiting for {what}; "
                        f"requests so far: {self.requests}"
                    )
                self._lock.wait(min(left, POLL))

    # --- lifecycle

    def connect(self) -> None:
        """Connect and say hello, as a starting ztunnel does."""
        if self.connected:
            raise RuntimeError("ztunnel test double is already connected")
        self.disconnect()  # the socket of a connection the agent ended
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.socket_path)
            hello = zds_pb2.ZdsHello(version=cast("zds_pb2.Version", self.hello_version))
            sock.send(hello.SerializeToString())
        except BaseException:
            sock.close()
            raise
        self.checks.said_hello()
        self._closing.clear()
        with self._lock:
            self._in_snapshot = set()
            self.connections += 1
            self.stream.append(Message(self.connections, "hello"))
        self._sock = sock
        self._reader = threading.Thread(
            target=self._read_loop, args=(sock,), name="ztunnel-double", daemon=True
        )
        self._reader.start()

    def disconnect(self) -> None:
        """Drop the connection; the workloads stay, as in a ztunnel that lost its socket."""
        sock, reader = self._sock, self._reader
        self._sock = self._reader = None
        self._closing.set()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if reader is not None:
            reader.join(timeout=10)
        if sock is not None:
            sock.close()

    def restart(self) -> None:
        """A new ztunnel process: nothing of the old one's state, then a fresh connection."""
        self.disconnect()
        self._forget_all()
        self.checks.restarted()
        self.connect()

    def close(self) -> None:
        """Disconnect and drop every workload; then, when strict, fail on any violation."""
        self.disconnect()
        self._forget_all()
        self.checks.close()
        if self.strict:
            self.assert_no_violations()

    def __enter__(self) -> ZtunnelDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_unasked(self) -> None:
        """Send an Ack nobody asked for (a protocol error for the agent)."""
        assert self._sock is not None, "not connected"
        self._sock.send(zds_pb2.WorkloadResponse(ack=zds_pb2.Ack()).SerializeToString())

    def wait_disconnected(self, timeout: float = 10.0) -> None:
        """Wait until the agent closed the connection."""
        reader = self._reader
        if reader is not None:
            reader.join(timeout)
            if reader.is_alive():
                raise AssertionError("ztunnel test double: the agent kept the connection open")

    # --- the protocol

    def _read_loop(self, sock: socket.socket) -> None:
        try:
            while True:
                try:
                    data, ancillary, _, _ = sock.recvmsg(1024, socket.CMSG_SPACE(4 * 4))
                except OSError:
                    return
                fds = _fds(ancillary)
                if not data:
                    _close_all(fds)
                    return
                request = zds_pb2.WorkloadRequest()
                request.ParseFromString(data)
                error = self._handle(request, fds)
                if self.ack_delay and self._closing.wait(self.ack_delay):
                    return
                if select.select([sock], [], [], 0)[0] and _pending_request(sock):
                    self.overlapped += 1
                ack = zds_pb2.WorkloadResponse(ack=zds_pb2.Ack(error=error))
                try:
                    sock.send(ack.SerializeToString())
                except OSError:
                    return
        finally:
            self.checks.disconnected()
            with self._lock:
                self._lock.notify_all()

    def _handle(self, request: zds_pb2.WorkloadRequest, fds: list[int]) -> str:
        self._log(request, fds)
        self.checks.request(request, fds)
        error = self._apply(request, fds)
        self.checks.answered(request, error)
        return error

    def _log(self, request: zds_pb2.WorkloadRequest, fds: list[int]) -> None:
        kind = request.WhichOneof("payload") or "none"
        body = getattr(request, kind) if kind != "none" else None
        info = None
        if kind == "add":
            w = request.add.workload_info
            info = (w.name, w.namespace, w.service_account)
        inode, name = None, ""
        with contextlib.suppress(OSError):
            inode = os.fstat(fds[0]).st_ino if fds else None
        if fds and self.netns_name is not None:
            name = self.netns_name(fds[0])
        uid = getattr(body, "uid", "")
        message = Message(self.connections, kind, uid, info, len(fds), inode, name)
        with self._lock:
            self.stream.append(message)

    def _apply(self, request: zds_pb2.WorkloadRequest, fds: list[int]) -> str:
        kind = request.WhichOneof("payload") or "none"
        try:
            if kind == "add":
                uid = request.add.uid
                self._record(kind, uid, fds)
                return self._add(request.add, fds[0] if fds else None)
            if kind == "keep":
                self._record(kind, request.keep.uid, fds)
                return ""
            if kind == "del":
                uid = getattr(request, "del").uid
                self._record(kind, uid, fds)
                self._forget(uid)
                return ""
            if kind == "snapshot_sent":
                self._record(kind, "", fds)
                self._end_snapshot()
                return ""
            self._record(kind, "", fds)
            return f"unknown request {kind}"
        finally:
            _close_all(fds)
            with self._lock:
                self._lock.notify_all()

    def _record(self, kind: str, uid: str, fds: list[int]) -> None:
        with self._lock:
            self.requests.append((kind, uid, bool(fds)))
            if self._in_snapshot is not None and uid:
                self._in_snapshot.add(uid)

    def _add(self, add: zds_pb2.AddWorkload, fd: int | None) -> str:
        if add.uid in self.refuse:
            return self.refuse[add.uid]
        if fd is None:
            return f"AddWorkload for {add.uid} came without a network namespace"
        inode = os.fstat(fd).st_ino
        existing = self.workloads().get(add.uid)
        if existing is not None and existing.netns_inode == inode:
            return ""  # the same pod again (a snapshot after a reconnect): nothing to do
        self._forget(add.uid)
        info = add.workload_info
        workload = Workload(add.uid, info.name, info.namespace, info.service_account, inode)
        try:
            workload.sockets = _in_netns(fd, lambda: _listeners(self.dns))
        except OSError as e:
            return f"cannot listen in the pod's network namespace: {e}"
        for sock in workload.sockets:
            thread = threading.Thread(
                target=_serve, args=(workload, sock), daemon=True, name=f"ztunnel-double:{add.uid}"
            )
            workload.threads.append(thread)
            thread.start()
        with self._lock:
            self._workloads[add.uid] = workload
        return ""

    def _end_snapshot(self) -> None:
        with self._lock:
            named, self._in_snapshot = self._in_snapshot or set(), None
            stale = [uid for uid in self._workloads if uid not in named]
            self.snapshots += 1
        for uid in stale:
            self._forget(uid)

    def _forget(self, uid: str) -> None:
        with self._lock:
            workload = self._workloads.pop(uid, None)
        if workload is not None:
            _shut(workload)

    def _forget_all(self) -> None:
        with self._lock:
            workloads, self._workloads = list(self._workloads.values()), {}
        for workload in workloads:
            _shut(workload)


def netns_cookie(fd: int) -> int:
    """SO_NETNS_COOKIE of the namespace at `fd`: the kernel never gives another namespace the
    same cookie (an inode number it does reuse)."""

    def cookie() -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")

    return _in_netns(fd, cookie)


INPOD_MARKS = ("ISTIO_PRERT", "ISTIO_OUTPUT", "istio-ambient")
"""What in-pod redirection leaves in a namespace's rule listings (iptables chains, and Istio's
native nftables tables)."""


def redirects(fd: int) -> bool:
    """Does the namespace at `fd` hold in-pod redirection rules? (nft lists iptables-nft's and
    native nftables rules; iptables-legacy-save the legacy ones.)"""

    def listing() -> str:
        out = []
        for argv in (["nft", "list", "ruleset"], ["iptables-legacy-save"]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out.append(subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout)
        return "\n".join(out)

    return any(mark in _in_netns(fd, listing) for mark in INPOD_MARKS)


def api_identity(core: Any) -> IdentityLookup:
    """Each WorkloadInfo compared with the API server's pod (kubernetes CoreV1Api `core`)."""

    def lookup(uid: str, namespace: str, name: str) -> PodIdentity | None:
        try:
            pod = core.read_namespaced_pod(name, namespace)
        except Exception:  # gone (or the API away): nothing to compare with
            return None
        if pod.metadata.uid != uid:
            return None  # the name is another pod's now
        return PodIdentity(uid, name, namespace, pod.spec.service_account_name or "")

    return lookup


def _pending_request(sock: socket.socket) -> bool:
    """Is a message (not the agent's hang-up) waiting to be read?"""
    try:
        return bool(sock.recv(1024, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False


def _fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(array.array("i", data[:usable]))
    return fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _in_netns(fd: int, fn: Callable[[], T]) -> T:
    """Run fn in a fresh thread moved into the namespace at fd (setns affects one thread only;
    sockets it creates stay in that namespace after the thread ends)."""
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")
            result.append(fn())
        except BaseException as e:
            error.append(e)

    thread = threading.Thread(target=body, name="ztunnel-double-setns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _listeners(dns: bool) -> list[socket.socket]:
    made: list[socket.socket] = []
    try:
        for port in TCP_PORTS:
            made.append(_tcp(socket.AF_INET, "0.0.0.0", port))
            with contextlib.suppress(OSError):  # a namespace without IPv6
                made.append(_tcp(socket.AF_INET6, "::", port))
        if dns:
            made.append(_tcp(socket.AF_INET, "127.0.0.1", DNS_PORT, transparent=False))
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            made.append(udp)
            udp.bind(("127.0.0.1", DNS_PORT))
    except BaseException:
        for sock in made:
            sock.close()
        raise
    for sock in made:
        sock.settimeout(POLL)
    return made


def _tcp(family: int, host: str, port: int, *, transparent: bool = True) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if transparent:
            level, option = (
                (socket.SOL_IP, IP_TRANSPARENT)
                if family == socket.AF_INET
                else (socket.IPPROTO_IPV6, IPV6_TRANSPARENT)
            )
            sock.setsockopt(level, option, 1)
        sock.bind((host, port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def _serve(workload: Workload, sock: socket.socket) -> None:
    port = sock.getsockname()[1]
    while not workload.closing.is_set():
        try:
            if sock.type == socket.SOCK_DGRAM:
                data, peer = sock.recvfrom(4096)
                workload.dns.append((_addr(peer), data))
                sock.sendto(data, peer)
                continue
            conn, peer = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        with conn:
            local = _addr(conn.getsockname())
            if port == DNS_PORT:
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    workload.dns.append((_addr(peer), conn.recv(4096)))
            else:
                workload.accepted.append(Accepted(port, _addr(peer), local, _original_dst(conn)))
            with contextlib.suppress(OSError):
                conn.sendall(f"ztunnel-double|{workload.uid}|{port}".encode())
                # Read what the client sent until it is done (bounded): closing with unread
                # data makes the kernel answer with a reset, and the client loses the reply.
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(1)
                while conn.recv(4096):
                    pass


def _original_dst(conn: socket.socket) -> str | None:
    try:
        if conn.family == socket.AF_INET6:  # IP6T_SO_ORIGINAL_DST: a sockaddr_in6
            raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
            address = socket.inet_ntop(socket.AF_INET6, raw[8:24])
        else:
            raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
            address = socket.inet_ntoa(raw[4:8])
    except OSError:
        return None
    return _addr((address, int.from_bytes(raw[2:4], "big")))


def _addr(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _shut(workload: Workload) -> None:
    # Threads first: a socket closed under a thread's accept could have its number reused.
    workload.closing.set()
    for thread in workload.threads:
        thread.join(timeout=5)
    for sock in workload.sockets:
        sock.close()


@contextlib.contextmanager
def kept_connected(double: ZtunnelDouble, interval: float = 0.2) -> Iterator[list[float]]:
    """While inside, `double` is connected again whenever its connection ended, as ztunnel
    reconnects to the agent's socket at once (a stand-in that stays away would leave every ADD
    refused with "no ztunnel connected", where the real one is back in a moment). Yields the
    times (time.monotonic()) of each reconnection, for the test to name."""
    stop = threading.Event()
    reconnected: list[float] = []

    def keep() -> None:
        while not stop.wait(interval):
            if not double.connected:
                with contextlib.suppress(OSError):  # the agent's socket not there yet
                    double.connect()
                    reconnected.append(time.monotonic())

    thread = threading.Thread(target=keep, name="ztunnel-double-keeper", daemon=True)
    thread.start()
    try:
        yield reconnected
    finally:
        stop.set()
        thread.join(10)
