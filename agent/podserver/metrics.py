"""Prometheus metrics of the plugin requests the agent answers."""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from agent.metrics import ADD_BUCKETS, EXEC_BUCKETS, RecentDurations
from agent.podserver.requests import Reply

# ADD runs a pod lookup and an iptables/nft apply: tens of ms normally, seconds when slow.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


# Why an ADD was refused (fail closed). A bounded set: a refusal names a step, never a pod.
# The first four are "cannot decide": the agent does not know whether the pod must be captured.
UNDECIDED_REASONS = (
    "lookup_failed",
    "pod_not_found",
    "decision_failed",
    "ambient_detection_failed",
)
REFUSAL_REASONS = (
    *UNDECIDED_REASONS,
    "apply_failed",
    "ambient_enrollment_failed",
    "bad_request",
    "internal_error",
)


# The label values of istio_cni_add_duration_seconds: closed sets, never a pod's string.
ADD_MODES = ("sidecar", "ambient", "none", "undecided")
"""sidecar: the pod's sidecar rules; ambient: enrolled in ambient; none: nothing to program
(skipped, no pod in the request); undecided: refused before the mode was known (lookup,
detection, a bad request)."""
ADD_RESULTS = ("ok", "retry", "error")
"""ok: the pod may start; retry: refused with "try again later" (the runtime retries the
sandbox); error: refused for good, or a bad request."""
EXEC_COMMANDS = ("add", "check", "del")

MAX_EXEC_SECONDS = 120.0
"""A plugin exec reported as longer is not believed: the plugin gives up on the agent after its
`agent_timeout_seconds` (10 s by default) and the runtime's own CNI deadlines are shorter."""


def add_result(status: int) -> str:
    """The `result` label of an ADD answered with HTTP `status`."""
    if status < 300:
        return "ok"
    return "retry" if status == 503 else "error"


def exec_seconds(started: object, now: float) -> float | None:
    """The plugin's exec so far, from the start time it reported (CLOCK_BOOTTIME seconds,
    plugin.commands.process_start) to `now` on the same clock; None when the report is not to
    be believed: not a finite number, in the future, or longer than MAX_EXEC_SECONDS. Anyone
    who reaches the socket may send any value: a bad one is ignored, never an error."""
    if isinstance(started, bool) or not isinstance(started, int | float):
        return None
    try:
        elapsed = now - float(started)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(elapsed) or not 0.0 <= elapsed <= MAX_EXEC_SECONDS:
        return None
    return elapsed


def boottime() -> float:
    """Seconds of CLOCK_BOOTTIME: the clock the plugin reports its process start on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class Trace:
    """What one request's metrics need beyond its reply: the ADD's mode once known, and the
    plugin process's start as the request reports it."""

    __slots__ = ("mode", "started_at")

    def __init__(self) -> None:
        self.mode = "undecided"
        self.started_at: object = None


class PluginMetrics:
    """istio_cni_plugin_requests_total{command,result}, its latency histogram,
    istio_cni_pods_refused_total{reason}, the ADD's latency by mode and result, the plugin's
    exec as the runtime sees it, and the recent ADDs for `istio-cni-agent status`."""

    def __init__(
        self, registry: CollectorRegistry, *, recent_adds: RecentDurations | None = None
    ) -> None:
        self.recent_adds = recent_adds or RecentDurations()
        self._children: dict[tuple[int | str, ...], Any] = {}
        self.add_latency = Histogram(
            "istio_cni_add_duration_seconds",
            "Time the agent took to answer a CNI ADD (lookup, decision, rules or ambient "
            "enrollment), by mode (sidecar, ambient, none, undecided) and result (ok, retry, "
            "error).",
            ["mode", "result"],
            buckets=ADD_BUCKETS,
            registry=registry,
        )
        self.plugin_exec = Histogram(
            "istio_cni_plugin_exec_duration_seconds",
            "The plugin's exec as the container runtime sees it, from the plugin process's start "
            "to the agent's answer, by command (add, check, del); requests the plugin answers "
            "without the agent are not in it.",
            ["command"],
            buckets=EXEC_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "istio_cni_plugin_requests",
            "CNI plugin requests answered by the agent, by command and result.",
            ["command", "result"],
            registry=registry,
        )
        self.latency = Histogram(
            "istio_cni_plugin_request_duration_seconds",
            "Time the agent took to answer a CNI plugin request, by command.",
            ["command"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.refusals = Counter(
            "istio_cni_pods_refused",
            "Pod starts the agent refused (a CNI ADD error, so the pod does not start "
            "uncaptured), by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REFUSAL_REASONS:  # every reason visible at 0, so rate() sees the first
            self.refusals.labels(reason=reason)

    def _child(self, metric: Counter | Histogram, *values: str) -> Any:
        """`metric.labels(*values)`, kept: a lookup there costs microseconds on every request,
        one here a dict get. The values are from closed sets, so the dict is bounded too."""
        key: tuple[int | str, ...] = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, metric.labels(*values))
        return child

    def observe(self, command: str, result: str, seconds: float) -> None:
        self._child(self.requests, command, result).inc()
        self._child(self.latency, command).observe(seconds)

    def answered(
        self, command: str, reply: Reply, reason: str, trace: Trace, seconds: float, *, now: float
    ) -> None:
        """A request answered with `reply` after `seconds`; `reason`: a refused ADD's; `now`:
        CLOCK_BOOTTIME as the answer leaves (agent.podserver.handlers).

        The plugin's exec is measured to `now` from the process start the plugin reported (on
        the same node and clock): its interpreter's start-up, its connect, the wait in the
        socket's queue and the agent's answer are all in it; what it does after the answer
        (read it, print the result, exit) is not: 1-2 ms of a 12 ms exec of the static build
        (bench/README.md, "metrics cost per ADD"), so the figure is a slight underestimate,
        never an overestimate. No request is added for it: the start rides on the request."""
        self.observe(command, reply.result, seconds)
        if command == "add":
            self.add_done(trace.mode, reply.status, seconds)
            if reply.status >= 400:
                self.refused(reason)
        if trace.started_at is not None:
            elapsed = exec_seconds(trace.started_at, now)
            if elapsed is not None:
                self.exec_done(command, elapsed)

    def add_done(self, mode: str, status: int, seconds: float) -> None:
        """An ADD answered with HTTP `status` after `seconds`; an unknown mode is undecided."""
        mode = mode if mode in ADD_MODES else "undecided"
        self._child(self.add_latency, mode, add_result(status)).observe(seconds)
        self.recent_adds.add(seconds)

    def exec_done(self, command: str, seconds: float) -> None:
        if command in EXEC_COMMANDS:
            self._child(self.plugin_exec, command).observe(seconds)

    def refused(self, reason: str) -> None:
        """Count a refused ADD; an unknown reason counts as internal_error (bounded labels)."""
        self.refusals.labels(reason=reason if reason in REFUSAL_REASONS else "internal_error").inc()


@functools.cache
def default_metrics() -> PluginMetrics:
    """The metrics in the process-wide registry that /metrics serves (created once)."""
    return PluginMetrics(REGISTRY)
