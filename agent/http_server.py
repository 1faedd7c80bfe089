"""/healthz, /readyz and /metrics on the chart's port (the DaemonSet is hostNetwork, probes hit
the node IP, so by default every address is listened on; `metricsAddress` narrows it).

Anyone who reaches the node can connect here, so the server is agent.serving's event loop: one
thread whatever the number of connections, at most `limits.HTTP.max_connections` of them, GET
and HEAD only, no request bodies, a request complete within 5 s and a head within 8 KiB.

/healthz is kubelet's liveness probe: 503 naming each of the agent's loops that ended without
being stopped or hangs past its heartbeat's bound (agent.liveness) and each liveness check that
fails (a mounted CNI dir deleted on the node), so a dead or stuck pod server or watcher gets the
agent restarted; the loop serving /healthz itself answers nothing once dead, which fails the
probe as surely.
/healthz and /readyz are answered on the loop's thread; /metrics on a worker thread of its own,
from a page built at most once per `METRICS_PERIOD` (`MetricsPage`): a flood of scrapes costs
one build a second and never holds a probe's answer.
Every pod on the node can reach this port, so what it answers has a budget (agent.serving.budget:
requests a second for the port and for each peer address, 429 past it), with an allowance of
probes per peer address kept apart: a flood from pods costs a bounded share of the agent's CPU
and leaves kubelet's probes, from the node's own address, answered. A hostNetwork pod shares
that address: with `node`, the node's own processes' connections are charged apart from it
(agent.serving.node_processes).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from agent.liveness import LIVENESS
from agent.serving import budget, limits
from agent.serving.http import Request, Response
from agent.serving.loop import Server
from agent.serving.node_processes import NodeProcesses

log = logging.getLogger(__name__)

Failing = Callable[[], Sequence[tuple[str, str]]]
"""(check, why) of each failing readiness check (agent.readiness), or of each loop that ended
(agent.liveness); empty when ready, or live."""
TEXT = "text/plain; charset=utf-8"
LISTEN_BACKLOG = 4096
"""Connections the kernel completes before the loop accepts them (capped by net.core.somaxconn,
4096 by default since Linux 5.4). A hostNetwork pod can open thousands in a burst; once the queue
is full the kernel drops the next handshake, and that peer waits out TCP's 1 s retransmit, a
whole kubelet probe timeout."""
METRICS_PATH = "/metrics"
METRICS_PERIOD = 1.0
"""Seconds between two builds of the /metrics page at most."""


class MetricsPage:
    """The /metrics page, never older than the request it answers, built at most once per
    `period`: requests that had arrived when a build began share its page; one that came later
    waits for the next build, which begins `period` after the last at the earliest."""

    def __init__(
        self,
        build: Callable[[], bytes] = lambda: generate_latest(REGISTRY),
        *,
        period: float = METRICS_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._build = build
        self._period = period
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._page = b""
        self._built_at: float | None = None
        """When the last build began."""
        self.builds = 0

    def get(self, asked: float | None = None) -> bytes:
        """The page for a request that arrived at `asked` (a monotonic time; default now)."""
        asked = self._clock() if asked is None else asked
        with self._lock:
            if self._built_at is not None:
                if self._built_at >= asked:
                    return self._page
                wait = self._built_at + self._period - self._clock()
                if wait > 0:
                    self._sleep(wait)
            self._built_at = self._clock()
            self._page = self._build()
            self.builds += 1
            return self._page


class _Endpoints:
    """The app: what each path answers."""

    def __init__(
        self, readiness: Failing, liveness: Failing, loops: Failing, metrics: MetricsPage
    ) -> None:
        self.readiness = readiness
        self.liveness = liveness
        self.loops = loops
        self.metrics = metrics

    def handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response(
                405, b"method not allowed\n", TEXT, close=True, headers=(("Allow", "GET, HEAD"),)
            )
        path = request.path
        if path == "/healthz":
            return _verdict([*self.loops(), *_checked(self.liveness, "liveness")], "ok", "not live")
        if path == "/readyz":
            return _verdict(_checked(self.readiness, "readiness"), "ready", "not ready")
        if path == METRICS_PATH:
            return Response(200, self.metrics.get(request.received), CONTENT_TYPE_LATEST)
        return Response(404, b"not found\n", TEXT)

    def refuse(self, status: int, message: str) -> Response:
        return Response(status, (message + "\n").encode(), TEXT, close=True)


def _checked(failing: Failing, name: str) -> Sequence[tuple[str, str]]:
    """What `failing` reports; itself, failing, when it raises (not a crashed server)."""
    try:
        return failing()
    except Exception as e:
        log.exception("%s raised", name)
        return [(name, f"raised {type(e).__name__}: {e}")]


def _verdict(failing: Sequence[tuple[str, str]], good: str, bad: str) -> Response:
    """200 `good`, or 503 naming what fails, then why each one does."""
    if not failing:
        return Response(200, f"{good}\n".encode(), TEXT)
    lines = [f"{bad}: " + ", ".join(name for name, _ in failing)]
    lines += [f"{name}: {why}" for name, why in failing]
    return Response(503, ("\n".join(lines) + "\n").encode(), TEXT)


def _offload(request: Request) -> bool:
    return request.path == METRICS_PATH


class HttpServer:
    """Service: serves liveness (no loop ended and no liveness check failing, each named with
    why), readiness (no check failing, each failing one named with why) and metrics."""

    def __init__(
        self,
        *,
        port: int,
        host: str = "",
        readiness: Failing = lambda: (),
        liveness: Failing = lambda: (),
        loops: Failing = LIVENESS.failing,
        metrics: MetricsPage | None = None,
        rates: budget.Rates | None = budget.HTTP,
        node: NodeProcesses | None = None,
    ) -> None:
        """`liveness`: what fails that only a new container mends, checked when probed;
        `loops`: the loops that ended without being stopped (agent.liveness); `rates`: the
        port's request budget (None: none, for a test of something else); `node`: tells the
        node's own processes' connections from hostNetwork pods' (None: they are charged to
        their address alike)."""
        self.host = host
        self.port = port
        self.readiness = readiness
        self.liveness = liveness
        self.loops = loops
        self.metrics = metrics or MetricsPage()
        self.rates = rates
        self.node = node
        self._server: Server | None = None
        self._port = 0

    def start(self) -> None:
        listener = _bind(self.host, self.port)
        self._port = int(listener.getsockname()[1])
        endpoints = _Endpoints(self.readiness, self.liveness, self.loops, self.metrics)
        # One worker builds /metrics: the loop's thread answers the probes meanwhile.
        # Any pod reaches this port: its requests have a budget, probes apart (serving.budget).
        self._server = Server(
            listener,
            endpoints,
            limits.HTTP,
            name="http",
            workers=1,
            offload=_offload,
            budget=None if self.rates is None else budget.Budget(self.rates, node=self.node),
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
