"""The dashboard and the alerts read only metrics the agent defines, and the dashboard shows what
an operator needs (its queries are also run on a real Prometheus: test_live_prometheus.py)."""

from __future__ import annotations

import json

import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest

import agent.lifecycle  # noqa: F401 (imports every module that defines a metric)
from agent.pods.metrics import default_cache_metrics
from agent.podserver.metrics import default_metrics
from tests.observability.dashboard import exported_names, metric_names, panels, queries
from tests.observability.promtool import ALERTS, DASHBOARD


@pytest.fixture(scope="module")
def defined() -> set[str]:
    """Every series name the agent process can export (its /metrics page's families)."""
    default_metrics()
    default_cache_metrics()
    return exported_names(generate_latest(REGISTRY).decode())


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{command="add"}[5m])))',
            {"a_bucket"},
        ),
        ('time() - max by (instance) (b{kind="pod",instance=~".*"} > 0)', {"b"}),
        ("count(c == 0) or vector(0)", {"c"}),
        ('sum without (x) (d{l="by (y)"}) / on (i) group_left e', {"d", "e"}),
    ],
    ids=["quantile", "time", "or-vector", "matching"],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_names_include_families_without_samples() -> None:
    text = (
        "# HELP x_total X.\n# TYPE x_total counter\n"
        "# HELP h H.\n# TYPE h histogram\n# HELP g G.\n# TYPE g gauge\ng 1.0\n"
    )
    assert {"x_total", "h_bucket", "h_count", "g"} <= exported_names(text)


def test_the_dashboard_reads_only_metrics_the_agent_defines(defined: set[str]) -> None:
    for where, expr in queries(DASHBOARD):
        unknown = metric_names(expr) - defined
        assert not unknown, f"{where}: {sorted(unknown)} is not an agent metric"


# What the alerts read besides the agent's own: Prometheus's scrape health and kube-state-metrics'
# pod series (named as kube-state-metrics v2 exports them).
FOREIGN = {"up", "kube_pod_info", "kube_pod_status_ready"}


def test_the_alerts_read_only_metrics_the_agent_defines(defined: set[str]) -> None:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - defined - FOREIGN
            assert not unknown, f"alert {rule['alert']}: {sorted(unknown)} is not an agent metric"


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {n for _, e in queries(DASHBOARD) for n in metric_names(e)}
    assert {
        "istio_cni_install_ready",
        "istio_cni_install_ready_timestamp_seconds",
        "istio_cni_plugin_requests_total",
        "istio_cni_plugin_request_duration_seconds_bucket",
        "istio_cni_pods_refused_total",
        "istio_cni_install_heals_total",
        "istio_cni_install_conflicts_total",
        "istio_cni_repair_pods_repaired_total",
        "istio_cni_cache_last_event_timestamp_seconds",
        "istio_cni_cache_objects",
        "istio_cni_rules_apply_failures_total",
    } <= used
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    # ADD rate and latency both cluster-wide and per node.
    for metric in (
        "istio_cni_plugin_requests_total",
        "istio_cni_plugin_request_duration_seconds_bucket",
    ):
        groupings = [e for e in exprs if metric in e]
        assert any("by (instance" in e for e in groupings), metric
        assert any("by (instance" not in e for e in groupings), metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], panel["title"]


LATENCY_HISTOGRAMS = (
    "istio_cni_add_duration_seconds",
    "istio_cni_plugin_exec_duration_seconds",
    "istio_cni_repair_duration_seconds",
    "istio_cni_ambient_enrollment_duration_seconds",
)


@pytest.mark.parametrize("metric", LATENCY_HISTOGRAMS)
def test_the_dashboard_shows_p50_and_p99_of_each_latency(metric: str, defined: set[str]) -> None:
    assert f"{metric}_bucket" in defined
    dashboard = json.loads(DASHBOARD.read_text())
    quantiles = set()
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = " ".join(target["expr"].split())
            if f"{metric}_bucket" not in expr:
                continue
            assert expr.startswith("histogram_quantile("), panel["title"]
            assert "le)" in expr or "le) " in expr, f"{panel['title']}: `le` aggregated away"
            assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]
            quantiles.add(expr.split("(", 1)[1].split(",", 1)[0])
    assert {"0.5", "0.99"} <= quantiles, f"{metric}: p50 and p99 panels, found {quantiles}"


def test_the_slow_add_alert_has_its_per_node_panel() -> None:
    """The panel the alert's runbook points at: the exec's p99 per node, the alert named."""
    dashboard = json.loads(DASHBOARD.read_text())
    rule = next(
        r
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if r["alert"] == "IstioCniAddSlow"
    )
    [panel] = [
        p
        for p in panels(dashboard)
        if any(
            "istio_cni_plugin_exec_duration_seconds_bucket" in t["expr"]
            and "by (instance, le)" in t["expr"]
            for t in p["targets"]
        )
    ]
    assert "IstioCniAddSlow" in panel["description"]
    assert rule["expr"].strip().endswith("> 1") and "above 1s" in panel["description"]
