"""The chart's observability options (podMonitor, prometheusRule, dashboards): off by default,
each rendered alone when enabled, pointing at what the agent pods really serve, carrying the
files promtool and the dashboard check read, and checked by the schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from testbed.helm import Helm, HelmError
from tests.chart.conftest import helm, of_kind, only  # noqa: F401 (fixture)
from tests.observability.promtool import ALERTS, DASHBOARD

pytestmark = pytest.mark.chart

ALL_ON = ("podMonitor.enabled=true", "prometheusRule.enabled=true", "dashboards.enabled=true")
# What an API server with the Prometheus operator's CRDs answers discovery with.
MONITORING = ["monitoring.coreos.com/v1"]


def dashboard_maps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]


def test_nothing_is_rendered_by_default(helm: Helm) -> None:  # noqa: F811
    docs = helm.render()
    assert of_kind(docs, "PodMonitor") == [] and of_kind(docs, "PrometheusRule") == []
    assert dashboard_maps(docs) == []


@pytest.mark.parametrize(
    ("option", "kind"),
    [
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
        ("dashboards", "ConfigMap"),
    ],
)
def test_each_option_renders_only_its_own_resource(
    helm: Helm,  # noqa: F811
    option: str,
    kind: str,
) -> None:
    docs = helm.render(sets=[f"{option}.enabled=true"], api_versions=MONITORING)
    extra = [d for d in docs if d["kind"] in ("PodMonitor", "PrometheusRule")]
    extra += dashboard_maps(docs)
    assert [d["kind"] for d in extra] == [kind]


def test_pod_monitor_scrapes_the_port_and_path_of_the_agent_pods(helm: Helm) -> None:  # noqa: F811
    docs = helm.render(
        sets=[
            *ALL_ON,
            "metricsPort=19014",
            "podMonitor.labels.release=kps",
            "podMonitor.interval=30s",
        ],
        api_versions=MONITORING,
    )
    monitor = only(docs, "PodMonitor")
    template = only(docs, "DaemonSet")["spec"]["template"]
    container = template["spec"]["containers"][0]
    notes = template["metadata"]["annotations"]
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    # The named port is the container's metrics port, the one the annotations name.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[endpoint["port"]] == 19014 == int(notes["prometheus.io/port"])
    assert endpoint["path"] == notes["prometheus.io/path"] == "/metrics"
    assert endpoint["interval"] == "30s" and "scrapeTimeout" not in endpoint
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["kube-system"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    # The job the alerts on `up` select: the pods' k8s-app label.
    assert template["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "istio-cni-node"


def test_prometheus_rule_carries_the_alert_file(helm: Helm) -> None:  # noqa: F811
    """The groups promtool tests, with the runbook base and the release's DaemonSet in place."""
    docs = helm.render(
        sets=[*ALL_ON, "prometheusRule.namespace=monitoring"], api_versions=MONITORING
    )
    rule = only(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())  # release istio-cni in kube-system
    docs = helm.render(
        sets=[*ALL_ON, "prometheusRule.runbookBaseUrl=https://wiki.example/oncall/istio-cni"],
        namespace="mesh",
        release="cni",
        api_versions=MONITORING,
    )
    rules = [r for g in only(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    for r in rules:
        assert r["annotations"]["runbook_url"] == (
            f"https://wiki.example/oncall/istio-cni/{r['alert']}.md"
        )
    (unavailable,) = [r for r in rules if r["alert"] == "IstioCniAgentUnavailable"]
    daemonset = only(docs, "DaemonSet")["metadata"]
    assert f'namespace="mesh", created_by_name="{daemonset["name"]}"' in unavailable["expr"]
    assert daemonset["namespace"] == "mesh"


@pytest.mark.parametrize("option", ["podMonitor", "prometheusRule"])
def test_monitoring_resources_need_the_operator_api(helm: Helm, option: str) -> None:  # noqa: F811
    """Without monitoring.coreos.com/v1 the render fails naming it, instead of an install that
    fails at apply time."""
    with pytest.raises(HelmError) as failed:
        helm.template(sets=[f"{option}.enabled=true"])
    assert f"{option}.enabled is true" in failed.value.stderr
    assert "monitoring.coreos.com/v1" in failed.value.stderr
    assert "--api-versions monitoring.coreos.com/v1" in failed.value.stderr


def test_dashboard_config_map_has_the_sidecar_label_and_the_dashboard(
    helm: Helm,  # noqa: F811
) -> None:
    docs = helm.render(sets=list(ALL_ON), api_versions=MONITORING)
    (cm,) = dashboard_maps(docs)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["istio-cni-agent.json"]) == json.loads(DASHBOARD.read_text())
    docs = helm.render(
        sets=[
            *ALL_ON,
            "dashboards.label=grafana-dash",
            "dashboards.labelValue=istio",
            "dashboards.annotations.f=Istio",
        ],
        api_versions=MONITORING,
    )
    (cm,) = dashboard_maps(docs)
    assert cm["metadata"]["labels"]["grafana-dash"] == "istio"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"f": "Istio"}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("podMonitor.interval=soon", "interval"),
        ("podMonitor.port=1", "port"),
        ("dashboards.label=", "label"),
        ("prometheusRule.enabled=maybe", "enabled"),
    ],
    ids=["bad-duration", "unknown-key", "empty-label", "not-boolean"],
)
def test_schema_rejects_bad_values_naming_them(
    helm: Helm,  # noqa: F811
    value: str,
    named: str,
) -> None:
    with pytest.raises(HelmError) as failed:
        helm.template(sets=[value])
    assert named in failed.value.stderr
