"""Liveness: whether every long-running loop of the agent still runs (what /healthz answers).

Every loop here is essential: the serving loops (the HTTP port, the pod socket, the status
socket), the install watcher, readiness, the caches, repair, ambient's and the others built on
agent.background. A loop that ends without being asked to stop (its body raised, or returned on
its own) is recorded once with why, logged as an error naming it and counted in
`istio_cni_loop_failures_total{loop}`; from then on /healthz answers 503 naming it, so kubelet's
liveness probe restarts the agent. Nothing restarts a loop inside the process: a loop that
ended on a bug would likely end again, and a restarted process starts from a clean state (its
start-up reconciles every pod). A record stays until the process restarts.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import Counter

log = logging.getLogger(__name__)

LOOP_FAILURES = Counter(
    "istio_cni_loop_failures",
    "Long-running loops of the agent that ended without being stopped (raised, or returned on "
    "their own), by loop: the agent's /healthz fails from the first one on.",
    ["loop"],
)


class Liveness:
    """The loops that ended unexpectedly, in the order they ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: dict[str, str] = {}

    def ended(self, loop: str, why: str) -> None:
        """Record that `loop` ended without being stopped, and why; logs and counts it."""
        LOOP_FAILURES.labels(loop=loop).inc()
        with self._lock:
            self._ended.setdefault(loop, why)
        log.error(
            "essential loop ended; the agent is no longer live and will be restarted",
            extra={"fields": {"loop": loop, "reason": why}},
        )

    def failing(self) -> list[tuple[str, str]]:
        """(loop, why) of each loop that ended unexpectedly; empty while all run."""
        with self._lock:
            return list(self._ended.items())


LIVENESS = Liveness()
"""The agent process's: every BackgroundLoop reports here unless given another."""
