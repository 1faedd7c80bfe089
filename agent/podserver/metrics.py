"""Prometheus metrics of the plugin requests the agent answers."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

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


class PluginMetrics:
    """istio_cni_plugin_requests_total{command,result}, its latency histogram, and
    istio_cni_pods_refused_total{reason}."""

    def __init__(self, registry: CollectorRegistry) -> None:
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

    def observe(self, command: str, result: str, seconds: float) -> None:
        self.requests.labels(command=command, result=result).inc()
        self.latency.labels(command=command).observe(seconds)

    def refused(self, reason: str) -> None:
        """Count a refused ADD; an unknown reason counts as internal_error (bounded labels)."""
        self.refusals.labels(reason=reason if reason in REFUSAL_REASONS else "internal_error").inc()


@functools.cache
def default_metrics() -> PluginMetrics:
    """The metrics in the process-wide registry that /metrics serves (created once)."""
    return PluginMetrics(REGISTRY)
