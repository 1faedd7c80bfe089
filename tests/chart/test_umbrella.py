"""The chart as a dependency of an umbrella chart: `istio-cni.enabled` switches it, `global.hub` and
`global.tag` reach its image."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.helm import CHART, Helm
from tests.chart.conftest import agent_container, of_kind

pytestmark = pytest.mark.chart


@pytest.fixture
def umbrella(helm: Helm, tmp_path: Path) -> Path:
    chart = tmp_path / "mesh"
    chart.mkdir()
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "mesh",
                "version": "1.0.0",
                "dependencies": [
                    {
                        "name": "istio-cni",
                        "version": yaml.safe_load((CHART / "Chart.yaml").read_text())["version"],
                        "repository": f"file://{CHART}",
                        "condition": "istio-cni.enabled",
                    }
                ],
            }
        )
    )
    (chart / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"hub": "registry.example/mesh", "tag": "1.2.3"},
                "istio-cni": {"enabled": True},
            }
        )
    )
    helm.run("dependency", "build", str(chart))
    assert (chart / "charts").is_dir() and list((chart / "charts").glob("istio-cni-*.tgz"))
    return chart


def test_enabled_renders_the_daemonset_with_global_hub_and_tag(helm: Helm, umbrella: Path) -> None:
    docs = helm.render(chart=umbrella, release="mesh")
    assert len(of_kind(docs, "DaemonSet")) == 1
    assert agent_container(docs)["image"] == "registry.example/mesh/istio-cni:1.2.3"
    assert {d["kind"] for d in docs} >= {"ConfigMap", "ServiceAccount", "ClusterRole"}


def test_own_hub_and_tag_win_over_global(helm: Helm, umbrella: Path) -> None:
    docs = helm.render(
        chart=umbrella,
        release="mesh",
        sets=["istio-cni.hub=own.example/cni", "istio-cni.tag=9.9"],
    )
    assert agent_container(docs)["image"] == "own.example/cni/istio-cni:9.9"


def test_subchart_values_and_presets_pass_through(helm: Helm, umbrella: Path) -> None:
    docs = helm.render(chart=umbrella, release="mesh", sets=["istio-cni.platform=gke"])
    volumes = of_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "cni-bin-dir",
        "hostPath": {"path": "/home/kubernetes/bin", "type": "DirectoryOrCreate"},
    } in volumes


def test_disabled_renders_none_of_it(helm: Helm, umbrella: Path) -> None:
    proc = helm.template(chart=umbrella, release="mesh", sets=["istio-cni.enabled=false"])
    assert [d for d in yaml.safe_load_all(proc.stdout) if d] == []


def test_bad_subchart_value_names_it(helm: Helm, umbrella: Path) -> None:
    proc = helm.template(
        chart=umbrella, release="mesh", sets=["istio-cni.logLevel=loud"], check=False
    )
    assert proc.returncode != 0
    assert "istio-cni" in proc.stderr and "logLevel" in proc.stderr
