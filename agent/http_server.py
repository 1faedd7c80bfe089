"""/healthz, /readyz and /metrics on the chart's port (the DaemonSet is hostNetwork, probes hit
the node IP, so by default every address is listened on; `metricsAddress` narrows it).

Anyone who reaches the node can connect here, so the server is agent.serving's event loop: one
thread whatever the number of connections, at most `limits.HTTP.max_connections` of them, GET
and HEAD only, no request bodies, a request complete within 5 s and a head within 8 KiB.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from agent.serving import limits
from agent.serving.http import Request, Response
from agent.serving.loop import Server

log = logging.getLogger(__name__)

Failing = Callable[[], Sequence[tuple[str, str]]]
"""(check, why) of each failing readiness check (agent.readiness); empty when ready."""
TEXT = "text/plain; charset=utf-8"
LISTEN_BACKLOG = 1024


class _Endpoints:
    """The app: what each path answers."""

    def __init__(self, readiness: Failing, liveness: Failing = lambda: ()) -> None:
        self.readiness = readiness
        self.liveness = liveness

    def handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response(
                405, b"method not allowed\n", TEXT, close=True, headers=(("Allow", "GET, HEAD"),)
            )
        path = request.path
        if path == "/healthz":
            dead = self.liveness()
            if dead:
                text = "".join(f"{name}: {why}\n" for name, why in dead)
                return Response(503, ("not live\n" + text).encode(), TEXT)
            return Response(200, b"ok\n", TEXT)
        if path == "/readyz":
            failing = self.failing_checks()
            if failing:
                lines = ["not ready: " + ", ".join(name for name, _ in failing)]
                lines += [f"{name}: {why}" for name, why in failing]
                return Response(503, ("\n".join(lines) + "\n").encode(), TEXT)
            return Response(200, b"ready\n", TEXT)
        if path == "/metrics":
            return Response(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        return Response(404, b"not found\n", TEXT)

    def refuse(self, status: int, message: str) -> Response:
        return Response(status, (message + "\n").encode(), TEXT, close=True)

    def failing_checks(self) -> Sequence[tuple[str, str]]:
        try:
            return self.readiness()
        except Exception as e:  # a broken readiness is not ready, not a crashed server
            log.exception("readiness raised")
            return [("readiness", f"raised {type(e).__name__}: {e}")]


class HttpServer:
    """Service: serves health, readiness (no check failing, each failing one named with why)
    and metrics."""

    def __init__(
        self,
        *,
        port: int,
        host: str = "",
        readiness: Failing = lambda: (),
        liveness: Failing = lambda: (),
    ) -> None:
        self.host = host
        self.port = port
        self.readiness = readiness
        self.liveness = liveness
        self._server: Server | None = None
        self._port = 0

    def start(self) -> None:
        listener = _bind(self.host, self.port)
        self._port = int(listener.getsockname()[1])
        self._server = Server(
            listener, _Endpoints(self.readiness, self.liveness), limits.HTTP, name="http"
        )
        self._server.start()
        log.info(
            "serving /healthz /readyz /metrics",
            extra={"fields": {"address": self.host or "*", "port": self._port}},
        )

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return self._port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()


def _bind(host: str, port: int) -> socket.socket:
    if host:
        return _listen(socket.AF_INET6 if ":" in host else socket.AF_INET, host, port)
    try:
        return _listen(socket.AF_INET6, "::", port)  # with IPV6_V6ONLY off: IPv4 too
    except OSError:  # IPv6 disabled on this node
        return _listen(socket.AF_INET, "0.0.0.0", port)


def _listen(family: socket.AddressFamily, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
