"""Prometheus metrics of the agent (default registry, served on /metrics). Istio's names where
Istio has one."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Gauge, Histogram

INSTALL_READY = Gauge(
    "istio_cni_install_ready",
    "1 while the plugin binary and its CNI config entry are in place and valid, else 0.",
)
INSTALLS = Counter(
    "istio_cni_installs",
    "Install runs (start-up and every repair), by result.",
    ["result"],
)
HEALS = Counter(
    "istio_cni_install_heals",
    "Times the agent put back a binary or config entry that something removed or changed.",
    ["kind"],
)
CONFLICTS = Counter(
    "istio_cni_install_conflicts",
    "Heals that undid another writer's change to a CNI config file, by file.",
    ["file"],
)
INSTALL_READY_SINCE = Gauge(
    "istio_cni_install_ready_timestamp_seconds",
    "Unix time the install last became ready (0: never since the agent started).",
)
RULES_APPLY_FAILURES = Counter(
    "istio_cni_rules_apply_failures",
    "Failures to program a pod's redirect rules (plugin ADD and repair), by rule backend.",
    ["backend"],
)

# Ambient mode (Istio's cni/pkg/nodeagent names).
RECONCILE_EVENTS = Counter(
    "nodeagent_reconcile_events",
    "The total number of node agent reconcile events.",
    ["type"],
)
# ztunnel_connected is the ZDS server's (agent.ambient.zds_metrics.ZdsMetrics).

# Latency. Fixed buckets per kind of wait, in seconds: what an operator reads as p50 and p99.
ADD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""The agent's answer to CNI ADD: a pod lookup and a rule apply, ms normally, seconds when the
API server or the rule backend is slow."""
EXEC_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""The plugin's exec as the runtime sees it: the interpreter's start (tens of ms) comes first."""
REPAIR_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Repair runs in rounds (every 5 s): seconds to minutes."""
ENROLLMENT_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    *(2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)
"""Ambient enrollment: ms while ztunnel answers at once, minutes while it is away."""

REPAIR_DURATION = Histogram(
    "istio_cni_repair_duration_seconds",
    "Time from the repair loop first finding a pod without redirect to having repaired, "
    "deleted or labelled it, by type.",
    ["type"],
    buckets=REPAIR_BUCKETS,
)
AMBIENT_ENROLLMENT_DURATION = Histogram(
    "istio_cni_ambient_enrollment_duration_seconds",
    "Time from the agent's first attempt to enroll a pod in ambient (a CNI ADD, or the watch "
    "for a running pod) to ztunnel acknowledging it, by source (cni, watch).",
    ["source"],
    buckets=ENROLLMENT_BUCKETS,
)


class RecentDurations:
    """The durations of the last `size` events within the last `window` seconds, for
    `istio-cni-agent status` (its p50 and p99). Memory is bounded by `size` whatever the rate;
    thread-safe (the pod server's threads add, the status socket reads)."""

    def __init__(
        self,
        *,
        size: int = 2048,
        window: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float]] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        with self._lock:
            self._samples.append((self._clock(), seconds))

    def summary(self) -> dict[str, float | int | None]:
        """{windowSeconds, count, p50Seconds, p99Seconds}; the quantiles None without events.
        Nearest rank: the value of the sample at rank ceil(q * count)."""
        since = self._clock() - self.window
        with self._lock:
            values = sorted(s for at, s in self._samples if at >= since)
        return {
            "windowSeconds": self.window,
            "count": len(values),
            "p50Seconds": nearest_rank(values, 0.5),
            "p99Seconds": nearest_rank(values, 0.99),
        }


def nearest_rank(ordered: Sequence[float], q: float) -> float | None:
    """The q-quantile of `ordered` (sorted) by nearest rank; None when empty."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
