"""A real Prometheus (Debian's) scrapes a running agent the way the chart tells it to, and its
HTTP API sees the agent's series change as pods are added, a foreign writer rewrites the
conflist, and the agent refuses a pod it cannot decide on. The dashboard's queries parse on that
server and name only metrics the running agent exports.

The agent runs as its DaemonSet would (tests/e2e/harness.py) against the test bed's API server;
the scrape target is the `prometheus.io/port` and `prometheus.io/path` the chart's DaemonSet in
the API server sets on its pods (the PodMonitor names the same port and path:
test_chart.py), at the node's address, which is loopback in the test bed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.install import conflist
from agent.install.atomic import atomic_write
from testbed.cni import CniCommandError, CniNode
from testbed.daemon import DaemonAgent
from testbed.helm import Helm
from testbed.node import NodePods
from tests.e2e.harness import ChartOnNode, Installed
from tests.observability.dashboard import exported_names, metric_names, queries
from tests.observability.prometheus import PrometheusServer, running_prometheus, scrape_config
from tests.observability.promtool import DASHBOARD

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.chart,
    pytest.mark.cluster,
    pytest.mark.netns,
    pytest.mark.observability,
]

JOB = "istio-cni-agent"
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": "{}"},
    "containers": [{"name": "app", "image": "app"}, {"name": "istio-proxy", "image": "proxy"}],
}


class Scraped:
    """The agent and the Prometheus scraping it."""

    def __init__(self, agent: DaemonAgent, prometheus: PrometheusServer, node: str) -> None:
        self.agent, self.prometheus, self.node = agent, prometheus, node

    def series(self, expr: str) -> float | None:
        return self.prometheus.value(expr)

    def wait_above(self, expr: str, floor: float, what: str) -> float:
        seen = self.prometheus.wait_value(expr, lambda v: v is not None and v > floor, what)
        assert seen is not None
        return seen


@pytest.fixture
def scraped(
    chart_on_node: ChartOnNode, helm_releases: Any, helm_binaries: dict[str, Any], tmp_path: Path
) -> Iterator[Scraped]:
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    installed: Installed = chart_on_node.install(helm, "istio-cni-observability")
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()
    # What Prometheus's kubernetes-pods job reads: the annotations the DaemonSet in the API server
    # gives its pods.
    notes = installed.daemonset["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    port = int(notes["prometheus.io/port"])
    assert port == agent.metrics_port
    config = scrape_config(
        job=JOB,
        address=f"127.0.0.1:{port}",
        metrics_path=notes["prometheus.io/path"],
        labels={
            "namespace": installed.namespace,
            "pod": installed.agent_pod,
            "node": chart_on_node.node_name,
        },
        targets_file=tmp_path / "targets.json",
    )
    with running_prometheus(tmp_path / "prometheus", config) as prometheus:
        prometheus.wait_value(f'up{{job="{JOB}"}}', lambda v: v == 1, "the agent scraped")
        yield Scraped(agent, prometheus, chart_on_node.node_name)
        print(f"--- prometheus log ---\n{prometheus.logs()}")


def test_prometheus_sees_pods_conflicts_and_refusals(
    scraped: Scraped,
    node_pods: NodePods,
    cni_node: CniNode,
) -> None:
    s = scraped
    assert s.series(f'istio_cni_install_ready{{job="{JOB}"}}') == 1
    assert (s.series("istio_cni_install_ready_timestamp_seconds") or 0) > 0
    heard = s.series('istio_cni_cache_last_event_timestamp_seconds{kind="pod"}')
    assert heard is not None and heard > 0

    # Pods added to the node: the cache's size rises by two, and an ADD is counted served.
    pods_before = s.wait_above('istio_cni_cache_objects{kind="pod"}', 0, "the agent pod cached")
    created = [node_pods.create("default", f"obs-app-{i}", **SIDECAR) for i in range(2)]
    s.prometheus.wait_value(
        'istio_cni_cache_objects{kind="pod"}',
        lambda v: v == pods_before + 2,
        "two more pods in the cache",
    )
    sandbox = cni_node.new_sandbox("obs-app-0", "default", created[0]["metadata"]["uid"])
    cni_node.add(sandbox)
    s.wait_above(
        'istio_cni_plugin_requests_total{command="add",result="redirected"}',
        0,
        "the redirected ADD",
    )

    # A foreign writer rewrites the conflist without our entry: the agent heals it, a conflict.
    conflicts = f'sum(istio_cni_install_conflicts_total{{file="{cni_node.conflist_path.name}"}})'
    before = s.series(conflicts) or 0.0
    rewritten = conflist.remove(json.loads(cni_node.conflist_path.read_text()))
    atomic_write(str(cni_node.conflist_path), conflist.dumps(rewritten))
    s.wait_above(conflicts, before, "a conflict counted")
    s.wait_above('sum(istio_cni_install_heals_total{kind="config"})', 0, "a config heal")

    # A sandbox of a pod the API server does not know: the agent cannot decide, so it refuses.
    refused = 'istio_cni_pods_refused_total{reason="pod_not_found"}'
    at_start = s.series(refused)
    assert at_start is not None  # exported at 0 from the start: rate() sees the first refusal
    ghost = cni_node.new_sandbox("obs-ghost", "default")
    with pytest.raises(CniCommandError):
        cni_node.add(ghost)
    s.wait_above(refused, at_start, "the refusal counted")
    assert s.series('sum(istio_cni_pods_refused_total{reason!="pod_not_found"})') == 0


def test_dashboard_queries_parse_and_name_only_exported_metrics(scraped: Scraped) -> None:
    status, text = scraped.agent.get("/metrics")
    assert status == 200
    exported = exported_names(text)
    checked = 0
    for where, expr in queries(DASHBOARD):
        scraped.prometheus.query(expr)  # raises QueryError naming the query when it does not parse
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the agent"
        checked += 1
    assert checked >= 15
    # The same names reach Prometheus: every family the dashboard reads that has a sample.
    names = {n for _, e in queries(DASHBOARD) for n in metric_names(e)}
    scraped_names = set(scraped.prometheus.api("label/__name__/values"))
    assert {"istio_cni_install_ready", "istio_cni_cache_objects"} <= names & scraped_names
