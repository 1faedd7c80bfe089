"""/healthz, /readyz and /metrics on the chart's port (the DaemonSet is hostNetwork, probes hit
the node IP, so by default every address is listened on)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)

Failing = Callable[[], Sequence[tuple[str, str]]]
"""(check, why) of each failing readiness check (agent.readiness); empty when ready."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            failing = self.server.failing_checks()
            if failing:
                lines = ["not ready: " + ", ".join(name for name, _ in failing)]
                lines += [f"{name}: {why}" for name, why in failing]
                self._reply(503, ("\n".join(lines) + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._reply(200, b"ready\n", "text/plain; charset=utf-8")
        elif path == "/metrics":
            self._reply(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        else:
            self._reply(404, b"not found\n", "text/plain; charset=utf-8")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # One socket for IPv4 and IPv6 node addresses.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    readiness: Failing
    """Set by HttpServer.start before serving."""

    def failing_checks(self) -> Sequence[tuple[str, str]]:
        try:
            return self.readiness()
        except Exception as e:  # a broken readiness is not ready, not a crashed server
            log.exception("readiness raised")
            return [("readiness", f"raised {type(e).__name__}: {e}")]


class HttpServer:
    """Service: serves health, readiness (no check failing, each failing one named with why)
    and metrics."""

    def __init__(self, *, port: int, host: str = "", readiness: Failing = lambda: ()) -> None:
        self.host = host
        self.port = port
        self.readiness = readiness
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        server = _bind(self.host, self.port)
        server.readiness = self.readiness
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
        self._thread.start()
        log.info(
            "serving /healthz /readyz /metrics",
            extra={"fields": {"address": self.host or "*", "port": server.server_address[1]}},
        )

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _bind(host: str, port: int) -> _Server:
    if host:
        if ":" in host:
            return _V6Server((host, port), _Handler)
        return _Server((host, port), _Handler)
    try:
        return _V6Server(("::", port), _Handler)
    except OSError:  # IPv6 disabled on this node
        return _Server(("0.0.0.0", port), _Handler)


class _V6Server(_Server):
    address_family = socket.AF_INET6
