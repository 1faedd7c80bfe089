"""Prometheus metrics of the list + watch caches (agent.pods.cache): size, staleness, relists.

Labelled by the cache's kind (pod, namespace): a bounded set, never an object name. Staleness is
a timestamp, not an age, so a stuck agent still shows it growing: `time() - ..._timestamp_seconds`.
"""

from __future__ import annotations

import functools
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class CacheMetrics:
    """istio_cni_cache_objects, istio_cni_cache_last_event_timestamp_seconds and
    istio_cni_cache_relists_total, one labelled child per cache kind."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.objects = Gauge(
            "istio_cni_cache_objects",
            "Objects in the agent's list + watch cache, by kind (pod: this node's pods).",
            ["kind"],
            registry=registry,
        )
        self.last_event = Gauge(
            "istio_cni_cache_last_event_timestamp_seconds",
            "Unix time the cache last heard from the API server (a list, a watch event or "
            "bookmark, or a watch the server ended cleanly), by kind; 0 before the first list.",
            ["kind"],
            registry=registry,
        )
        self.relists = Counter(
            "istio_cni_cache_relists",
            "Full lists of the cache (the first one, and after an expired watch version), by kind.",
            ["kind"],
            registry=registry,
        )

    def created(self, kind: str) -> None:
        """Show the cache's series from its creation (a never-listed cache reads as stale)."""
        self.objects.labels(kind=kind)
        self.last_event.labels(kind=kind)
        self.relists.labels(kind=kind)

    def listed(self, kind: str, size: int) -> None:
        self.relists.labels(kind=kind).inc()
        self.changed(kind, size)

    def changed(self, kind: str, size: int) -> None:
        """An event arrived (size is the store's size after it)."""
        self.objects.labels(kind=kind).set(size)
        self.heard(kind)

    def heard(self, kind: str, now: float | None = None) -> None:
        """The API server answered without changing the store (a bookmark, a watch timeout)."""
        self.last_event.labels(kind=kind).set(time.time() if now is None else now)


@functools.cache
def default_cache_metrics() -> CacheMetrics:
    """The metrics in the process-wide registry that /metrics serves (created once)."""
    return CacheMetrics(REGISTRY)
