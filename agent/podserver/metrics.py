"""Prometheus metrics of the plugin requests the agent answers."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

# ADD runs a pod lookup and an iptables/nft apply: tens of ms normally, seconds when slow.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PluginMetrics:
    """istio_cni_plugin_requests_total{command,result} and its latency histogram."""

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

    def observe(self, command: str, result: str, seconds: float) -> None:
        self.requests.labels(command=command, result=result).inc()
        self.latency.labels(command=command).observe(seconds)


@functools.cache
def default_metrics() -> PluginMetrics:
    """The metrics in the process-wide registry that /metrics serves (created once)."""
    return PluginMetrics(REGISTRY)
