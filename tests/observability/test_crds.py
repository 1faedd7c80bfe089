"""The chart's PodMonitor and PrometheusRule as the Prometheus operator's CRDs define them: the
test bed's real kube-apiserver, with the operator's CRDs (testbed/operator_crds.py) installed,
validates the rendered resources against the CRD schemas (strict field validation, so a
misspelled field is an error rather than silently pruned), and rejects broken copies of them."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from testbed import operator_crds
from testbed.crds import wait_established
from testbed.helm import Helm, HelmError
from testbed.parts import MissingPartError
from tests.chart.conftest import helm, only  # noqa: F401 (fixture)
from tests.fixtures import _require

pytestmark = [pytest.mark.cluster, pytest.mark.chart]

GROUP, VERSION = "monitoring.coreos.com", "v1"
PLURALS = {"PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}
RELEASE_NS = "crd-check-agent"
"""The release namespace the chart is rendered for (the agent's pods would live here)."""
MONITORING_NS = "crd-check-monitoring"
"""Where the variation that moves the monitoring resources puts them."""
ENABLED = ("podMonitor.enabled=true", "prometheusRule.enabled=true", "dashboards.enabled=true")

VARIATIONS = {
    "only-enabled": [*ENABLED],
    "all-options": [
        *ENABLED,
        "podMonitor.labels.release=kube-prometheus-stack",
        "podMonitor.interval=30s",
        "podMonitor.scrapeTimeout=10s",
        "prometheusRule.labels.release=kube-prometheus-stack",
        "prometheusRule.labels.team=platform",
    ],
    "own-namespaces": [
        *ENABLED,
        f"podMonitor.namespace={MONITORING_NS}",
        f"prometheusRule.namespace={MONITORING_NS}",
        "podMonitor.interval=1m30s",
        "podMonitor.scrapeTimeout=500ms",
        "fullnameOverride=cni-agent",
    ],
}


@pytest.fixture(scope="module")
def monitoring_api(kube_config: str) -> Iterator[Any]:
    """CustomObjectsApi on the test bed's API server with the operator's two CRDs Established and
    the namespaces the rendered resources go to; all removed again at the end."""
    files = _require(operator_crds.crd_files)
    api = k8s_config.new_client_from_config(config_file=kube_config)
    ext, core = k8s.ApiextensionsV1Api(api), k8s.CoreV1Api(api)
    crds: list[str] = []
    namespaces: list[str] = []
    try:
        for path in files.values():
            body = yaml.safe_load(path.read_text())
            ext.create_custom_resource_definition(body)
            crds.append(body["metadata"]["name"])
        for name in crds:
            wait_established(ext, name)
        for ns in (RELEASE_NS, MONITORING_NS):
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
            namespaces.append(ns)
        yield k8s.CustomObjectsApi(api)
    finally:
        for ns in namespaces:
            _delete(core.delete_namespace, ns)
        for name in crds:
            _delete(ext.delete_custom_resource_definition, name)
        api.close()


def _delete(call: Callable[..., Any], *args: Any) -> None:
    """call(*args), a delete; already gone is fine."""
    try:
        call(*args)
    except ApiException as e:
        if e.status != 404:
            raise


class Created:
    """Creates custom objects with strict field validation and deletes them all at the end."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.made: list[tuple[str, str, str]] = []

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        plural, ns = PLURALS[doc["kind"]], doc["metadata"]["namespace"]
        stored: dict[str, Any] = self.api.create_namespaced_custom_object(
            GROUP, VERSION, ns, plural, doc, field_validation="Strict"
        )
        self.made.append((ns, plural, doc["metadata"]["name"]))
        return stored

    def close(self) -> None:
        for ns, plural, name in self.made:
            _delete(self.api.delete_namespaced_custom_object, GROUP, VERSION, ns, plural, name)


@pytest.fixture
def created(monitoring_api: Any) -> Iterator[Created]:
    objects = Created(monitoring_api)
    try:
        yield objects
    finally:
        objects.close()


def rendered(helm: Helm, sets: list[str]) -> dict[str, dict[str, Any]]:  # noqa: F811
    docs = helm.render(sets=sets, namespace=RELEASE_NS, api_versions=["monitoring.coreos.com/v1"])
    return {kind: only(docs, kind) for kind in PLURALS}


def missing_from(stored: Any, sent: Any, path: str = "") -> list[str]:
    """Paths of `sent` that `stored` does not hold with the same value (server defaults that
    `stored` adds are not differences)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [p for k, v in sent.items() for p in missing_from(stored.get(k), v, f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [
            p
            for i, (a, b) in enumerate(zip(stored, sent, strict=True))
            for p in missing_from(a, b, f"{path}[{i}]")
        ]
    return [] if stored == sent else [path]


@pytest.mark.parametrize("variation", list(VARIATIONS))
def test_api_server_accepts_the_rendered_resources(
    helm: Helm,  # noqa: F811
    created: Created,
    variation: str,
) -> None:
    for kind, doc in rendered(helm, VARIATIONS[variation]).items():
        stored = created.create(doc)
        assert stored["kind"] == kind and stored["metadata"]["uid"]
        # Stored as sent: nothing pruned by the schema, every label kept.
        assert missing_from(stored["spec"], doc["spec"]) == [], kind
        assert doc["metadata"]["labels"].items() <= stored["metadata"]["labels"].items()
        if variation == "own-namespaces":
            assert stored["metadata"]["namespace"] == MONITORING_NS


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value


def _remove(doc: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    del node[last]


@pytest.mark.parametrize(
    "duration", ["30s", "1m30s", "500ms", "2h", "1d", "1w", "1y2w", "30s1m", "1m1m", "1.5m", "5 m"]
)
def test_chart_schema_and_api_server_agree_on_durations(
    helm: Helm,  # noqa: F811
    created: Created,
    duration: str,
) -> None:
    """A scrape interval or timeout the chart accepts is one the API server accepts, and one it
    refuses at `helm template` is one the API server would refuse at install. (Bare numbers are
    left out: `--set` turns them into integers, which the schema refuses for their type.)"""
    sets = [*ENABLED, f"podMonitor.interval={duration}", f"podMonitor.scrapeTimeout={duration}"]
    try:
        doc = rendered(helm, sets)["PodMonitor"]
    except HelmError:
        chart_accepts = False
        doc = rendered(helm, list(ENABLED))["PodMonitor"]
        for key in ("interval", "scrapeTimeout"):
            doc["spec"]["podMetricsEndpoints"][0][key] = duration
    else:
        chart_accepts = True
    try:
        created.create(doc)
        server_accepts = True
    except ApiException as e:
        assert e.status == 422, e.body
        server_accepts = False
    assert chart_accepts == server_accepts, f"chart {chart_accepts}, API server {server_accepts}"


BROKEN = [
    # (kind, change, field the server names, status)
    ("PodMonitor", ("set", "spec.podMetricsEndpoints.0.port", 19014), "port", 422),
    ("PodMonitor", ("set", "spec.podMetricsEndpoints.0.interval", "30 seconds"), "interval", 422),
    ("PodMonitor", ("set", "spec.podMetricsEndpoints.0.scrapeEvery", "30s"), "scrapeEvery", 400),
    ("PodMonitor", ("set", "spec.selector.matchLabels", ["istio-cni"]), "matchLabels", 422),
    ("PrometheusRule", ("remove", "spec.groups.0.rules.0.expr", None), "expr", 422),
    ("PrometheusRule", ("set", "spec.groups.0.rules.0.for", "5 minutes"), "for", 422),
    ("PrometheusRule", ("set", "spec.groups.0.interval", "often"), "interval", 422),
]


@pytest.mark.parametrize(
    ("kind", "change", "named", "status"),
    BROKEN,
    ids=[
        "port-not-a-name",
        "interval-not-a-duration",
        "unknown-field",
        "selector-not-a-map",
        "rule-without-expr",
        "for-not-a-duration",
        "group-interval-not-a-duration",
    ],
)
def test_api_server_rejects_a_broken_copy(
    helm: Helm,  # noqa: F811
    created: Created,
    kind: str,
    change: tuple[str, str, Any],
    named: str,
    status: int,
) -> None:
    """Validation is on: the same resource with one field broken is refused, naming the field,
    while the unbroken one is accepted."""
    doc = rendered(helm, VARIATIONS["all-options"])[kind]
    broken = copy.deepcopy(doc)
    action, path, value = change
    if action == "set":
        _set(broken, path, value)
    else:
        _remove(broken, path)
    with pytest.raises(ApiException) as refused:
        created.create(broken)
    assert refused.value.status == status, refused.value.body
    assert named in str(refused.value.body), refused.value.body
    created.create(doc)


def wait_default_service_account(core: Any, namespace: str, timeout: float = 30.0) -> None:
    """Pod admission needs the namespace's `default` ServiceAccount (the controller makes it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def test_pod_monitor_selects_the_agent_pods(
    helm: Helm,  # noqa: F811
    monitoring_api: Any,
    kube_core: Any,
) -> None:
    """The API server's own label selection: the PodMonitor's selector and namespace selector
    find a pod made from the DaemonSet's pod template labels, and not a pod of another app."""
    docs = helm.render(
        sets=list(ENABLED), namespace=RELEASE_NS, api_versions=["monitoring.coreos.com/v1"]
    )
    monitor = only(docs, "PodMonitor")
    template = only(docs, "DaemonSet")["spec"]["template"]
    selector = ",".join(f"{k}={v}" for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (namespace,) = monitor["spec"]["namespaceSelector"]["matchNames"]
    assert namespace == RELEASE_NS
    pods = {"agent": template["metadata"]["labels"], "other": {"app": "other"}}
    wait_default_service_account(kube_core, namespace)
    made = []
    try:
        for name, labels in pods.items():
            kube_core.create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": f"crd-check-{name}", "labels": labels},
                    # Never scheduled: no node runs here, only the labels matter.
                    "spec": {
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "c", "image": "example.invalid/none"}],
                    },
                },
            )
            made.append(f"crd-check-{name}")
        found = kube_core.list_namespaced_pod(namespace, label_selector=selector).items
        assert [p.metadata.name for p in found] == ["crd-check-agent"]
    finally:
        for name in made:
            _delete(kube_core.delete_namespaced_pod, name, namespace)


def test_crds_are_fetched_once_per_version_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh cache gets the two CRDs of the pinned version; later calls reuse them without Go."""
    monkeypatch.setenv("ISTIO_CNI_CACHE", str(tmp_path))
    files = operator_crds.crd_files()
    for kind, path in files.items():
        assert path.parent == tmp_path / "prometheus-operator-crds" / operator_crds.VERSION
        crd = yaml.safe_load(path.read_text())
        assert (crd["kind"], crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (
            "CustomResourceDefinition",
            GROUP,
            kind,
        )
    assert not list(tmp_path.rglob(".*.tmp")), "no temp file left behind"
    monkeypatch.setenv("GO", "/bin/false")  # any download now fails
    assert operator_crds.crd_files() == files


def test_a_failed_fetch_names_the_module_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ISTIO_CNI_CACHE", str(tmp_path))
    monkeypatch.setenv("GO", "/bin/false")
    with pytest.raises(MissingPartError) as failed:
        operator_crds.crd_files()
    assert f"{operator_crds.MODULE}@{operator_crds.VERSION}" in str(failed.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
