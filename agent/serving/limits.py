"""How much a peer may take from a server: connections, bytes and time; and the process's own
descriptor limit, raised at start so the caps below, not the kernel, decide who is refused."""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """One server's bounds. Over `max_connections` the oldest connection that is not being
    answered is closed to make room (a newcomer is refused only when every one is)."""

    max_connections: int
    max_head_bytes: int = 8 << 10
    """Request line and headers together."""
    max_body_bytes: int = 0
    """0: no request may carry a body."""
    request_timeout: float = 5.0
    """From a request's first byte to its last (slowloris: a trickle never completes in time)."""
    idle_timeout: float = 30.0
    """How long a connection may wait for its next request's first byte."""
    write_timeout: float = 5.0
    """How long the peer may take to read a reply."""


HTTP = Limits(max_connections=128, idle_timeout=30.0)
"""/healthz, /readyz, /metrics: kubelet's probes and a few scrapers need a handful."""
POD_SOCKET = Limits(
    max_connections=256,
    max_body_bytes=1 << 20,  # plugin.wire.MAX_BODY
    request_timeout=10.0,
    idle_timeout=60.0,
    write_timeout=10.0,
)
"""The plugin's socket: one connection per CNI call, 110 pods may start at once."""
POD_WORKERS = 128
"""Threads answering plugin requests side by side (a node's 110 pods starting together)."""


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard one where the container allows it; returns
    (soft, hard) in force afterwards and logs what changed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        log.info("descriptor limit", extra={"fields": {"soft": soft, "hard": hard}})
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as e:
        log.warning(
            "cannot raise the descriptor limit: %s",
            e,
            extra={"fields": {"soft": soft, "hard": hard}},
        )
        return soft, hard
    log.info("raised the descriptor limit", extra={"fields": {"from": soft, "soft": hard}})
    return hard, hard
