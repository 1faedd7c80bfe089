"""The plugin request metrics live in the process-wide registry that /metrics serves."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from agent.podserver.metrics import PluginMetrics, default_metrics


def test_default_metrics_are_registered_once() -> None:
    assert default_metrics() is default_metrics()  # a second registration would raise
    default_metrics().observe("add", "redirected", 0.02)
    text = generate_latest(REGISTRY).decode()
    assert 'istio_cni_plugin_requests_total{command="add",result="redirected"}' in text
    assert 'istio_cni_plugin_request_duration_seconds_bucket{command="add",le="0.025"}' in text


def test_observe_counts_by_command_and_result() -> None:
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry)
    metrics.observe("add", "error", 0.5)
    metrics.observe("add", "error", 0.5)
    metrics.observe("del", "skipped", 0.001)
    sample = registry.get_sample_value
    assert sample("istio_cni_plugin_requests_total", {"command": "add", "result": "error"}) == 2
    assert sample("istio_cni_plugin_requests_total", {"command": "del", "result": "skipped"}) == 1
    assert sample("istio_cni_plugin_request_duration_seconds_sum", {"command": "add"}) == 1.0
