"""The ZDS server: hands enrolled pods' network namespaces to the node's ztunnel (`ZtunnelLink`).

As Istio's node agent (cni/pkg/nodeagent/ztunnelserver*.go): the agent listens on ztunnel's
socket (SOCK_SEQPACKET), ztunnel connects and says hello, the agent sends every pod it knows as a
snapshot, then each new pod (AddWorkload, netns as SCM_RIGHTS) and each removal (DelWorkload).

- Pods: the server keeps every added pod with its namespace open (Istio's pod netns cache), also
  while no ztunnel is connected, so the next snapshot carries it; `remove` forgets it. The
  snapshot source adds pods the agent found enrolled at start-up; a pod whose namespace cannot
  be opened is sent as KeepWorkload, so ztunnel keeps its own state for it.
- Connections: several ztunnels may be connected during a ztunnel rollout. Adds go to the
  newest one that has said hello; removals go to all (Istio's connMgr). Each new connection gets
  a fresh snapshot. The `ztunnel_connected` gauge counts connections, as Istio's does.
- One difference: a hello whose version is not V1 closes the connection (Istio logs it and goes
  on); this agent speaks only V1 and says so rather than guessing at a newer protocol.
- Bounds (Istio has none but a pace of 5 accepts a second, which lets a flood hold the listen
  backlog against ztunnel's reconnect): at most MAX_CONNECTIONS connections; for a newcomer over
  that, the oldest one that has not said hello is closed (ztunnel says hello at once, so a
  connection that has not is not a working ztunnel), and when every one has, the newcomer is.
  Accepts are not paced, so the backlog stays free for ztunnel. A peer that is neither root nor
  the agent's user (SO_PEERCRED) is refused at accept.
- Liveness: each connection's thread has a heartbeat (agent.liveness, `zds-connection`), beaten
  at each turn: the hello read, each snapshot pod, each request served or keepalive probe (an
  idle connection turns every keepalive interval). A thread stuck in one past
  `connection_heartbeat` (a snapshot source that never returns, a lock never released) fails
  /healthz naming it.

The socket is created as the pod server's is (agent.podserver.server): bound under a temporary
name, mode 0600, renamed over a stale one, then listening. 0600 is enough for ztunnel: it runs as
uid 0 (Istio's ztunnel chart, runAsUser 0) and, with every capability dropped but NET_ADMIN,
SYS_ADMIN and NET_RAW, it passes the permission check as the socket's owner, not by override.
Istio leaves the umask's mode (0755); nobody but root ever needs to connect.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from agent import unix_socket
from agent.ambient import zds_pb2
from agent.ambient.dataplane import AmbientPod, SnapshotSource
from agent.ambient.zds_conn import (
    IO_TIMEOUT,
    KEEPALIVE_INTERVAL,
    AckTimeout,
    Connection,
    ConnectionClosed,
    ProtocolError,
    Request,
    SnapshotItem,
    delete_request,
)
from agent.ambient.zds_metrics import ZdsMetrics, default_metrics
from agent.background import JOIN_TIMEOUT_SECONDS, BackgroundLoop
from agent.errors import SocketPathError, ZdsServerError, ZtunnelError, ZtunnelNotConnected
from agent.liveness import LIVENESS, Liveness
from agent.serving.peer import untrusted_peer
from agent.socket_keeper import KEEP_SECONDS, SocketKeeper

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/ztunnel/ztunnel.sock"
"""Istio's ztunnel-uds-address default."""
ACCEPT_INTERVAL = 0.2
"""How often the accept loop looks for stop(); the pause after a failed accept."""
MAX_CONNECTIONS = 16
"""A node runs one ztunnel; a rollout briefly two. Each connection holds a thread."""
LISTEN_BACKLOG = 64
REPORT_INTERVAL = 10.0
CONNECTION_NAME = "zds-connection"
"""The connection threads' name in agent.liveness (and istio_cni_loop_hangs_total's label)."""


def connection_heartbeat(io_timeout: float, keepalive_interval: float) -> float:
    """A connection thread's heartbeat bound: its longest turn is an idle wait of the keepalive
    interval, then a request written and its ack read (each within `io_timeout`); that, and
    30 s for a loaded node (45 s with Istio's timeouts)."""
    return keepalive_interval + 2 * io_timeout + 30.0


@dataclass
class _Pod:
    pod: AmbientPod
    fd: int
    """The pod's network namespace, open while the pod is known (snapshots send a dup)."""


class ZdsServer:
    """`ZtunnelLink` over ztunnel's socket at `socket_path`, served from background threads."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        metrics: ZdsMetrics | None = None,
        io_timeout: float = IO_TIMEOUT,
        keepalive_interval: float = KEEPALIVE_INTERVAL,
        request_timeout: float | None = None,
        liveness: Liveness = LIVENESS,
        join_timeout: float = JOIN_TIMEOUT_SECONDS,
    ) -> None:
        """`liveness`: where the connection threads' heartbeats are judged; `join_timeout`: how
        long stop() waits for the connection threads, all together."""
        self.socket_path = socket_path
        self._liveness = liveness
        self._join_timeout = join_timeout
        self._metrics = metrics or default_metrics()
        self._io_timeout = io_timeout
        self._keepalive = keepalive_interval
        # Queued behind at most a snapshot's worth of requests, then a write and an ack.
        self.request_timeout = request_timeout or 3 * io_timeout
        """How long add and remove wait for ztunnel's ack."""
        self._source: SnapshotSource | None = None
        self._lock = threading.Lock()
        self._pods: dict[str, _Pod] = {}
        self._conns: list[Connection] = []
        self._threads: dict[Connection, threading.Thread] = {}
        self._listener: socket.socket | None = None
        self._inode: int | None = None
        self._path_keeper = SocketKeeper(
            socket_path,
            kind=socket.SOCK_SEQPACKET,
            what="ZDS socket",
            bind=lambda sock: _bind(sock, socket_path),
        )
        # A turn is an accept that times out within ACCEPT_INTERVAL, or one admission.
        self._accept = BackgroundLoop("zds-accept", self._accept_loop, heartbeat=60.0)
        self._stopping = self._accept.stopping
        self._unreported: dict[str, int] = {}
        self._next_report = 0.0

    # --- lifecycle

    def start(self) -> None:
        if self._listener is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self._inode = _bind(sock, self.socket_path)
            sock.settimeout(ACCEPT_INTERVAL)  # so the accept loop sees stop()
        except BaseException:
            sock.close()
            raise
        self._listener = sock
        self._metrics.connected.set(0)
        self._accept.start()
        log.info("ZDS server listening", extra={"fields": {"socket": self.socket_path}})

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is None:
            return
        self._accept.stop()
        listener.close()
        self._remove_socket()
        with self._lock:
            conns, threads = list(self._conns), dict(self._threads)
        for conn in conns:
            conn.close()
        # Bounded: a connection thread stuck in a turn (a snapshot source that never returns)
        # must not keep the agent from stopping; a daemon thread, it cannot hold the exit.
        deadline = time.monotonic() + self._join_timeout
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in threads.values() if t.is_alive()]
        if left:
            log.warning(
                "ZDS connection threads still busy at stop; left running",
                extra={"fields": {"threads": ",".join(left), "waitedSeconds": self._join_timeout}},
            )
        with self._lock:
            for entry in self._pods.values():
                os.close(entry.fd)
            self._pods.clear()
        log.info("ZDS server stopped", extra={"fields": {"socket": self.socket_path}})

    def ready(self) -> bool:
        return self._listener is not None

    @property
    def connected(self) -> bool:
        with self._lock:
            return any(c.synced.is_set() and not c.closed for c in self._conns)

    def set_snapshot_source(self, source: SnapshotSource) -> None:
        self._source = source

    # --- pods

    def add(self, pod: AmbientPod) -> None:
        what = f"add pod {pod.namespace}/{pod.name} ({pod.uid}) to ztunnel"
        try:
            fd = os.open(pod.netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ZtunnelError(
                f"{what}: open network namespace {pod.netns_path}: {e.strerror or e}"
            ) from e
        with self._lock:
            old = self._pods.pop(pod.uid, None)
            if old is not None:
                os.close(old.fd)
            self._pods[pod.uid] = _Pod(pod, fd)
            conn = self._latest()
            sent_fd = os.dup(fd) if conn is not None else None
        if conn is None:
            raise ZtunnelNotConnected(
                f"{what}: no ztunnel connected; it gets the pod in the snapshot when it connects"
            )
        message = zds_pb2.WorkloadRequest(
            add=zds_pb2.AddWorkload(uid=pod.uid, workload_info=_workload(pod))
        )
        log.info("sending pod to ztunnel", extra={"fields": _fields(pod, conn)})
        response = self._wait(self._submit(conn, message, sent_fd, what), what)
        if response.ack.error:
            raise ZtunnelError(f"{what}: ztunnel refused it: {response.ack.error}")

    def remove(self, uid: str) -> None:
        with self._lock:
            entry = self._pods.pop(uid, None)
            conns = [c for c in self._conns if not c.closed]
        if entry is not None:
            os.close(entry.fd)
        what = f"remove pod {uid} from ztunnel"
        message = delete_request(uid)
        requests: list[tuple[Connection, Request]] = []
        for conn in conns:
            with contextlib.suppress(ConnectionClosed):  # gone: its successor's snapshot omits it
                requests.append((conn, conn.submit(message)))
        errors: list[str] = []
        for conn, request in requests:
            try:
                response = self._wait(request, what)
            except ZtunnelNotConnected:
                continue
            except ZtunnelError as e:
                errors.append(str(e))
                continue
            if response.ack.error:  # as Istio: logged; ztunnel no longer has the pod either way
                log.warning(
                    "ztunnel answered DelWorkload with an error: %s",
                    response.ack.error,
                    extra={"fields": {"uid": uid, "conn": conn.id}},
                )
        if errors:
            raise ZtunnelError("; ".join(errors))

    # --- internals

    def _latest(self) -> Connection | None:
        for conn in reversed(self._conns):
            if conn.greeted.is_set() and not conn.closed:
                return conn
        return None

    def _submit(
        self, conn: Connection, message: zds_pb2.WorkloadRequest, fd: int | None, what: str
    ) -> Request:
        try:
            return conn.submit(message, fd)
        except ConnectionClosed as e:
            raise ZtunnelNotConnected(
                f"{what}: ztunnel disconnected; it gets the pod in the snapshot when it reconnects"
            ) from e

    def _wait(self, request: Request, what: str) -> zds_pb2.WorkloadResponse:
        try:
            return request.future.result(timeout=self.request_timeout)
        except (FutureTimeout, CancelledError) as e:
            request.future.cancel()  # not sent yet: never send it
            raise ZtunnelError(
                f"{what}: no ack from ztunnel within {self.request_timeout:g}s"
            ) from e
        except (AckTimeout, ProtocolError) as e:
            raise ZtunnelError(f"{what}: {e}") from e
        except ConnectionClosed as e:
            raise ZtunnelNotConnected(f"{what}: {e}; it gets the pod in the next snapshot") from e

    def _snapshot(self) -> list[SnapshotItem]:
        """What a newly connected ztunnel must hold: the source's pods and every added pod."""
        source_pods = list(self._source()) if self._source is not None else []
        items: dict[str, SnapshotItem] = {}
        with self._lock:
            for uid, entry in self._pods.items():
                items[uid] = SnapshotItem(uid, _workload(entry.pod), os.dup(entry.fd))
        for pod in source_pods:
            if pod.uid not in items:
                items[pod.uid] = SnapshotItem(pod.uid, _workload(pod), _open_or_none(pod))
        return list(items.values())

    def _accept_loop(self) -> None:
        next_look = time.monotonic() + KEEP_SECONDS
        while not self._stopping.is_set():
            self._accept.beat()
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + KEEP_SECONDS
                self.keep_socket()
            listener = self._listener
            if listener is None:
                return
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._stopping.is_set():
                    return
                log.error("accept a ztunnel connection: %s", e)
                time.sleep(ACCEPT_INTERVAL)
                continue
            self._admit(sock)

    def keep_socket(self) -> bool:
        """The accept loop's: bind the path again when it no longer names ours and nobody
        answers there (agent.socket_keeper), and accept there; True when it did."""
        taken = self._path_keeper.take_back(self._inode)
        if taken is None:
            return False
        taken[0].settimeout(ACCEPT_INTERVAL)
        with self._lock:  # stop() takes the listener under it
            old = self._listener
            if old is not None:
                self._listener, self._inode = taken
        if old is None:  # stopped meanwhile: nothing of this socket stays
            taken[0].close()
            unix_socket.remove_if_ours(self.socket_path, taken[1])
            return False
        old.close()
        return True

    def _admit(self, sock: socket.socket) -> None:
        refused = untrusted_peer(sock)
        if refused is None:
            refused = self._make_room()
        if refused is not None:
            self._report(f"refused: {refused}")
            sock.close()
            return
        self._open(sock)

    def _report(self, what: str) -> None:
        """Count connections closed or refused by the bounds; a warning at most every
        REPORT_INTERVAL (a flood must not become a flood of log lines)."""
        self._unreported[what] = self._unreported.get(what, 0) + 1
        now = time.monotonic()
        if now >= self._next_report:
            self._next_report = now + REPORT_INTERVAL
            log.warning("ZDS connections closed or refused", extra={"fields": self._unreported})
            self._unreported = {}

    def _make_room(self) -> str | None:
        """Close the oldest connection that has not said hello when at the cap; None when
        there is room now, else why the newcomer is refused."""
        with self._lock:
            live = [c for c in self._conns if not c.closed]
        if len(live) < MAX_CONNECTIONS:
            return None
        silent = next((c for c in live if not c.greeted.is_set()), None)
        if silent is None:
            return f"{MAX_CONNECTIONS} ztunnel connections are open, each has said hello"
        self._report(f"closed without hello, over the cap of {MAX_CONNECTIONS}")
        silent.close()
        return None

    def _open(self, sock: socket.socket) -> None:
        heart = self._liveness.heart(
            CONNECTION_NAME, connection_heartbeat(self._io_timeout, self._keepalive)
        )
        conn = Connection(
            sock,
            snapshot=self._snapshot,
            io_timeout=self._io_timeout,
            keepalive_interval=self._keepalive,
            beat=heart.beat,
        )
        thread = threading.Thread(
            target=self._serve, args=(conn, heart.quiet), name=conn.id, daemon=True
        )
        with self._lock:
            self._conns.append(conn)
            self._threads[conn] = thread
            count = len(self._conns)
        self._metrics.connected.set(count)
        log.info("ztunnel connected", extra={"fields": {"conn": conn.id, "connections": count}})
        thread.start()

    def _serve(self, conn: Connection, quiet: Callable[[], None]) -> None:
        try:
            conn.run()
        finally:
            quiet()  # ended: nothing left to judge
            with self._lock:
                self._conns.remove(conn)
                self._threads.pop(conn, None)
                count = len(self._conns)
            self._metrics.connected.set(count)
            log.info(
                "ztunnel connection ended",
                extra={"fields": {"conn": conn.id, "connections": count}},
            )

    def _remove_socket(self) -> None:
        unix_socket.remove_if_ours(self.socket_path, self._inode)


def _workload(pod: AmbientPod) -> zds_pb2.WorkloadInfo:
    return zds_pb2.WorkloadInfo(
        name=pod.name, namespace=pod.namespace, service_account=pod.service_account
    )


def _fields(pod: AmbientPod, conn: Connection) -> dict[str, str]:
    return {"uid": pod.uid, "pod": f"{pod.namespace}/{pod.name}", "conn": conn.id}


def _open_or_none(pod: AmbientPod) -> int | None:
    if not pod.netns_path:  # enrolled before a restart, its namespace not found then
        log.info(
            "network namespace of a snapshot pod unknown; sending KeepWorkload",
            extra={"fields": {"uid": pod.uid, "pod": f"{pod.namespace}/{pod.name}"}},
        )
        return None
    try:
        return os.open(pod.netns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        log.warning(
            "network namespace of a snapshot pod not found; sending KeepWorkload: %s",
            e.strerror or e,
            extra={"fields": {"uid": pod.uid, "netns": pod.netns_path}},
        )
        return None


def _bind(sock: socket.socket, path: str) -> int:
    """Bind `sock` at `path` with mode 0600 (agent.unix_socket); returns the inode."""
    try:
        return unix_socket.bind_private(sock, path, what="ZDS socket", backlog=LISTEN_BACKLOG)
    except SocketPathError as e:
        raise ZdsServerError(str(e)) from e
