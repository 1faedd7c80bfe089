"""The ZDS server's metrics: Istio's ztunnel_connected gauge."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Gauge


class ZdsMetrics:
    """Istio's ztunnel_connected gauge: ztunnel connections open now."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "ztunnel_connected", "number of connections to ztunnel", registry=registry
        )


@functools.cache
def default_metrics() -> ZdsMetrics:
    """The metrics in the process-wide registry that /metrics serves (created once)."""
    return ZdsMetrics(REGISTRY)
