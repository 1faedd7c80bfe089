"""The HTTP/1.1 server on the agent's Unix socket: a thin shell that routes to PodHandlers.

The socket is created under a temporary name, set to mode 0600, renamed over the final path and
only then put in the listening state: a stale socket from a previous agent is replaced
atomically, and while the socket still has the umask's mode (between bind and chmod) nothing can
connect to it (a bound socket that does not listen refuses every connection).

Mode 0600, owner root: only root can connect. Istio's listener chmods its socket 0666; ours is
stricter on purpose. The one client is the plugin, which the container runtime runs as root, and
root needs no permission bit; anyone else able to connect could send ADD requests that make the
agent program redirect rules in a network namespace of its choice, so no one else may. The run
dir is created 0700 when the agent creates it (Istio: 0750); an existing one (the DaemonSet's
hostPath) keeps its mode, the socket's own mode guards it.

Served by agent.serving's event loop on a thread of its own, apart from the HTTP port and the ZDS
socket: the loop reads every connection, a pool of `limits.POD_WORKERS` threads answers complete
requests side by side. At most `limits.POD_SOCKET.max_connections` connections (the longest
waiting idle one is closed for a newcomer), a request complete within 10 s, bodies up to 1 MiB,
and a peer that is neither root nor the agent's user (SO_PEERCRED) is refused at accept.

The socket's path is looked at every KEEP_SECONDS: should it no longer name this server's socket
while nobody answers there (another agent of the node, a rolling update's newer pod, took it
over and then went away, removing it; or someone deleted it), the server binds it again and
accepts there, so the node's pod starts do not fail until the agent restarts. A socket someone
else serves at the path is left alone: that agent is the newer one.

A worker stuck in one request (a netns operation that never returns, a call with no timeout)
fails the agent's liveness as `pod-server-workers` once that request has run past `work_bound`,
made of the timeouts of what an ADD waits on; idle workers never count (agent.liveness.Pool).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from agent import unix_socket
from agent.background import JOIN_TIMEOUT_SECONDS, BackgroundLoop
from agent.errors import ServerError, SocketPathError
from agent.kube import api
from agent.liveness import LIVENESS, Liveness
from agent.netns import COMMAND_TIMEOUT_SECONDS
from agent.podserver.handlers import PodHandlers
from agent.podserver.requests import Reply, failure
from agent.serving import limits
from agent.serving.http import Request, Response
from agent.serving.loop import STOP_GRACE, Server
from agent.serving.peer import untrusted_peer
from agent.socket_keeper import KEEP_SECONDS, SocketKeeper
from plugin import wire

log = logging.getLogger(__name__)

# 110 pods may start at once; a full backlog makes a non-blocking connect fail at once.
LISTEN_BACKLOG = 1024
ADD_PROGRAMS = 8
"""The most programs an ADD runs in the pod's netns one after another: iptables-restore (or nft)
and `ip rule` and `ip route` for each of IPv4 and IPv6, and the rule backend's probe."""


def work_bound(timeouts: api.Timeouts, ztunnel_seconds: float = 0.0) -> float:
    """The longest one request may keep its worker before the worker counts as stuck: what an
    ADD waits on one after another, each up to its timeout (the pod and its namespace looked
    up, its programs run, ambient's annotation patched and ztunnel's ack, `ztunnel_seconds`),
    twice over: an ambient ADD may first wait for the watch's enrollment of the same pod, which
    waits on the same. With the default settings about 17 minutes: a worker past it is stuck
    for good, not slow."""
    kube = timeouts.settings
    lookups = 2 * (api.CONNECT_SECONDS + kube.lookupTimeoutSeconds)
    patch = api.CONNECT_SECONDS + kube.updateTimeoutSeconds
    one_add = lookups + ADD_PROGRAMS * COMMAND_TIMEOUT_SECONDS + patch + ztunnel_seconds
    return 2 * one_add


DEFAULT_WORK_BOUND = work_bound(api.DEFAULT_TIMEOUTS)


Route = Callable[[PodHandlers, bytes], Reply]

ROUTES: dict[tuple[str, str], Route] = {
    ("POST", wire.PATH_ADD): PodHandlers.add,
    ("POST", wire.PATH_CHECK): PodHandlers.check,
    ("POST", wire.PATH_DEL): PodHandlers.delete,
    ("POST", wire.PATH_GC): PodHandlers.gc,
    ("POST", wire.PATH_LOG): PodHandlers.log,
    ("GET", wire.PATH_STATUS): lambda handlers, _body: handlers.status(),
}


class _Routes:
    """The app: a request to its handler, a Reply to a JSON response."""

    def __init__(self, handlers: PodHandlers) -> None:
        self.handlers = handlers

    def handle(self, request: Request) -> Response:
        method, path = request.method, request.path
        route = ROUTES.get((method, path))
        if route is not None:
            return _response(route(self.handlers, request.body))
        allowed = [m for (m, p) in ROUTES if p == path]
        if allowed:
            return _response(failure(405, wire.INTERNAL, f"{method} {path}: use {allowed[0]}"))
        return _response(failure(404, wire.INTERNAL, f"{method} {path}: no such endpoint"))

    def refuse(self, status: int, message: str) -> Response:
        code = wire.INTERNAL if status >= 500 else wire.DECODING_FAILURE
        return _response(failure(status, code, message), close=True)


def _response(reply: Reply, *, close: bool = False) -> Response:
    return Response(reply.status, wire.encode(reply.body), "application/json", close=close)


class PodServer:
    """Serves PodHandlers on `socket_path` from a background thread."""

    def __init__(
        self,
        socket_path: str,
        handlers: PodHandlers,
        *,
        work_bound: float = DEFAULT_WORK_BOUND,
        liveness: Liveness = LIVENESS,
        stop_grace: float = STOP_GRACE,
        join_timeout: float = JOIN_TIMEOUT_SECONDS,
    ) -> None:
        """`work_bound`: the longest a worker may take over one request (agent.liveness);
        `liveness`: where the server's loop and workers are judged; `stop_grace` and
        `join_timeout`: how long stop() waits for replies being worked on, then for the
        workers (agent.serving.loop.Server)."""
        self.socket_path = socket_path
        self._handlers = handlers
        self._work_bound = work_bound
        self._liveness = liveness
        self._stop_grace = stop_grace
        self._join_timeout = join_timeout
        self._server: Server | None = None
        self._inode: int | None = None
        self._keeper: BackgroundLoop | None = None
        self._path_keeper = SocketKeeper(
            socket_path,
            kind=socket.SOCK_STREAM,
            what="pod server socket",
            bind=lambda sock: _bind(sock, socket_path),
        )

    def start(self) -> None:
        if self._server is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._inode = _bind(sock, self.socket_path)
        except BaseException:
            sock.close()
            raise
        # Its own thread and workers: nothing on the HTTP port or the ZDS socket waits with it.
        self._server = Server(
            sock,
            _Routes(self._handlers),
            limits.POD_SOCKET,
            name="pod-server",
            workers=limits.POD_WORKERS,
            check_peer=untrusted_peer,
            liveness=self._liveness,
            work_bound=self._work_bound,
            stop_grace=self._stop_grace,
            join_timeout=self._join_timeout,
        )
        self._server.start()
        self._keeper = BackgroundLoop.every(
            "pod-socket-keeper",
            KEEP_SECONDS,
            self.keep_socket,
            failed="looking at the pod server's socket failed",
            # No heartbeat bound: a look is an lstat and a connect bounded by its timeout.
            liveness=self._liveness,
        )
        self._keeper.start()
        log.info("pod server listening", extra={"fields": {"socket": self.socket_path}})

    def keep_socket(self) -> bool:
        """Bind the socket's path again when it no longer names ours and nobody answers there
        (agent.socket_keeper); True when it did."""
        server = self._server
        if server is None:
            return False
        taken = self._path_keeper.take_back(self._inode)
        if taken is None:
            return False
        sock, self._inode = taken
        server.replace_listener(sock)
        return True

    def stop(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        self._remove_socket()
        log.info("pod server stopped", extra={"fields": {"socket": self.socket_path}})

    def listening(self) -> bool:
        return self._server is not None

    def _remove_socket(self) -> None:
        unix_socket.remove_if_ours(self.socket_path, self._inode)


def _bind(sock: socket.socket, path: str) -> int:
    """Bind `sock` at `path` with mode 0600 (agent.unix_socket); returns the inode."""
    try:
        return unix_socket.bind_private(
            sock, path, what="pod server socket", backlog=LISTEN_BACKLOG
        )
    except SocketPathError as e:
        raise ServerError(str(e)) from e
