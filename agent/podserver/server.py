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
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from agent import unix_socket
from agent.errors import AgentError
from agent.podserver.handlers import CODE_DECODE, CODE_UNKNOWN, PodHandlers, Reply, failure
from plugin import wire

log = logging.getLogger(__name__)

MAX_BODY_BYTES = wire.MAX_BODY
IDLE_TIMEOUT_SECONDS = 60.0
# 110 pods may start at once; a full backlog makes a non-blocking connect fail at once.
LISTEN_BACKLOG = 1024


class ServerError(AgentError):
    """The pod server could not listen on its socket (message names the path)."""


Route = Callable[[PodHandlers, bytes], Reply]

ROUTES: dict[tuple[str, str], Route] = {
    ("POST", wire.PATH_ADD): PodHandlers.add,
    ("POST", wire.PATH_CHECK): PodHandlers.check,
    ("POST", wire.PATH_DEL): PodHandlers.delete,
    ("POST", wire.PATH_GC): PodHandlers.gc,
    ("POST", wire.PATH_LOG): PodHandlers.log,
    ("GET", wire.PATH_STATUS): lambda handlers, _body: handlers.status(),
}


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and what curl --unix-socket speaks
    server_version = "istio-cni-agent"
    timeout = IDLE_TIMEOUT_SECONDS
    server: _UnixHTTPServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        route = ROUTES.get((method, path))
        if route is None:
            allowed = [m for (m, p) in ROUTES if p == path]
            self._discard_body()
            if allowed:
                self._send(failure(405, CODE_UNKNOWN, f"{method} {path}: use {allowed[0]}"))
            else:
                self._send(failure(404, CODE_UNKNOWN, f"{method} {path}: no such endpoint"))
            return
        body = self._read_body() if method == "POST" else b""
        if isinstance(body, Reply):
            self._send(body)
            return
        self._send(route(self.server.handlers, body))

    def _read_body(self) -> bytes | Reply:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            return failure(411, CODE_DECODE, "chunked request bodies are not accepted")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            return failure(400, CODE_DECODE, "Content-Length is not a number")
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read: the connection is unusable
            return failure(413, CODE_DECODE, f"request body of {length} bytes is over 1 MiB")
        return self.rfile.read(length)

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if 0 <= length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        else:
            self.close_connection = True

    def _send(self, reply: Reply) -> None:
        payload = wire.encode(reply.body)
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def address_string(self) -> str:
        return "unix"  # AF_UNIX peers have no address; the default indexes an empty string

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http " + format, *args)


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = False
    block_on_close = True  # server_close() joins the request threads
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, handlers: PodHandlers) -> None:
        super().__init__("", _RequestHandler, bind_and_activate=False)
        self.handlers = handlers
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def end_reads(self) -> None:
        """Make idle keep-alive connections see EOF; in-flight replies are still written."""
        with self._open_lock:
            for conn in self._open:
                with contextlib.suppress(OSError):  # already closed by the peer
                    conn.shutdown(socket.SHUT_RD)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("pod server connection failed", exc_info=True)


class PodServer:
    """Serves PodHandlers on `socket_path` from a background thread."""

    def __init__(self, socket_path: str, handlers: PodHandlers) -> None:
        self.socket_path = socket_path
        self._handlers = handlers
        self._server: _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._inode: int | None = None

    def start(self) -> None:
        if self._server is not None:
            return
        server = _UnixHTTPServer(self._handlers)
        try:
            self._inode = _bind(server.socket, self.socket_path)
            server.server_address = self.socket_path
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="pod-server",
            daemon=True,
        )
        self._thread.start()
        log.info("pod server listening", extra={"fields": {"socket": self.socket_path}})

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        self._remove_socket()
        server.end_reads()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        log.info("pod server stopped", extra={"fields": {"socket": self.socket_path}})

    def listening(self) -> bool:
        return self._server is not None

    def _remove_socket(self) -> None:
        unix_socket.remove_if_ours(self.socket_path, self._inode)


def _bind(sock: socket.socket, path: str) -> int:
    """Bind `sock` at `path` with mode 0600 (agent.unix_socket); returns the inode."""
    try:
        return unix_socket.bind_private(sock, path, what="pod server socket")
    except unix_socket.SocketPathError as e:
        raise ServerError(str(e)) from e
