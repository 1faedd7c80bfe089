"""The example umbrella (`examples/umbrella/`): Istio's `base` and `istiod` from Istio's chart
repository at one Istio version and this chart from the checkout; rendered offline with Istio's
dependencies pointed at the test bed's copies of the pinned charts (testbed/umbrella.py). Its
values file alone switches istiod to the agent (the injector's `pilot.cni.enabled`) and installs
the agent; `istio_cni.enabled=false` leaves the agent out; `global.profile=ambient` reaches both
Istio's charts and ours. The node tier installs it (tests/node/test_istiod_umbrella.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import umbrella
from testbed.helm import CHART, Helm
from testbed.parts import cache_dir
from tests.chart.conftest import HELM_VERSIONS, of_kind, only

pytestmark = pytest.mark.chart


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once (with Helm 4) for the renders; each Helm builds its own in the test below."""
    home = tmp_path_factory.mktemp("helm-home")
    binary = cache_dir() / "helm" / HELM_VERSIONS[-1] / "helm"
    if not os.access(binary, os.X_OK):
        pytest.fail(
            f"Helm {HELM_VERSIONS[-1]} missing at {binary}: run ci/setup-helm", pytrace=False
        )
    built = tmp_path_factory.mktemp("example") / "umbrella"
    return umbrella.offline_copy(Helm(binary=binary, home=home), built)


def render(helm: Helm, chart: Path, *sets: str) -> list[dict[str, Any]]:
    """The parsed manifests (libyaml's parser: Istio's CRDs are 15,000 lines)."""
    out = helm.template(chart=chart, release=umbrella.RELEASE, namespace="istio-system", sets=sets)
    return [d for d in yaml.load_all(out.stdout, Loader=yaml.CSafeLoader) if d]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: rendered {len(found)}"
    return found[0]


def injector_values(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The values istiod's injector renders its templates with."""
    values: dict[str, Any] = json.loads(
        named(docs, "ConfigMap", "istio-sidecar-injector")["data"]["values"]
    )
    return values


def agent_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The agent's config.yaml (its ConfigMap is named after the release, as the DaemonSet)."""
    name = only(docs, "DaemonSet")["metadata"]["name"]
    settings: dict[str, Any] = yaml.safe_load(named(docs, "ConfigMap", name)["data"]["config.yaml"])
    return settings


def istiod_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    container = named(docs, "Deployment", "istiod")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_dependencies_istio_repository_one_version_and_this_chart() -> None:
    deps = {d["name"]: d for d in umbrella.dependencies()}
    assert list(deps) == ["base", "istiod", "istio-cni"]
    assert deps["base"]["repository"] == deps["istiod"]["repository"] == umbrella.ISTIO_REPOSITORY
    assert deps["base"]["version"] == deps["istiod"]["version"], "one Istio release for both"
    ours = deps["istio-cni"]
    path = (umbrella.EXAMPLE / ours["repository"].removeprefix("file://")).resolve()
    assert path == CHART
    assert ours["version"] == umbrella.chart_version(CHART)
    assert ours["condition"].split(",")[0] == "istio_cni.enabled"


def test_dependency_update_and_build_offline(helm: Helm, tmp_path: Path) -> None:
    built = umbrella.offline_copy(helm, tmp_path / "umbrella")
    lock = yaml.safe_load((built / "Chart.lock").read_text())
    assert [d["name"] for d in lock["dependencies"]] == ["base", "istiod", "istio-cni"]
    packaged = sorted(p.name for p in (built / "charts").glob("*.tgz"))
    assert packaged == [
        "base-1.0.0.tgz",
        f"istio-cni-{umbrella.chart_version(CHART)}.tgz",
        "istiod-1.0.0.tgz",
    ]


def test_values_file_installs_all_three_with_istiod_on_cni(helm: Helm, chart: Path) -> None:
    docs = render(helm, chart)
    assert len(of_kind(docs, "CustomResourceDefinition")) > 10  # Istio's base
    assert named(docs, "Deployment", "istiod")["metadata"]["namespace"] == "istio-system"
    agent = only(docs, "DaemonSet")
    assert agent["metadata"]["namespace"] == "istio-system"
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "ghcr.io/istio-cni/istio-cni:"
    )
    assert injector_values(docs)["pilot"]["cni"]["enabled"] is True
    # Istio's validator of the release namespace and the default-revision one of base.
    webhooks = {d["metadata"]["name"] for d in of_kind(docs, "ValidatingWebhookConfiguration")}
    assert webhooks == {"istio-validator-istio-system", "istiod-default-validator"}


def test_istio_cni_disabled_leaves_the_agent_out(helm: Helm, chart: Path) -> None:
    docs = render(helm, chart, "istio_cni.enabled=false")
    assert of_kind(docs, "DaemonSet") == []
    assert named(docs, "Deployment", "istiod")


def test_global_profile_ambient_reaches_istio_and_the_agent(helm: Helm, chart: Path) -> None:
    docs = render(helm, chart, "global.profile=ambient")
    assert istiod_env(docs).get("PILOT_ENABLE_AMBIENT") == "true"
    assert agent_settings(docs)["ambient"]["enabled"] is True
    assert agent_settings(render(helm, chart))["ambient"]["enabled"] is False


def test_example_values_are_only_what_the_readme_names() -> None:
    values = yaml.safe_load((umbrella.EXAMPLE / "values.yaml").read_text())
    assert values == {
        "global": {"istioNamespace": "istio-system"},
        "istio_cni": {"enabled": True},
        "istiod": {"pilot": {"cni": {"enabled": True}}},
        "istio-cni": {},
    }
