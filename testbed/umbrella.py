"""The umbrella chart of `examples/umbrella/` (Istio's `base` and `istiod` charts with this chart)
in the test bed, with no network:

    offline_copy()    the example copied, its Istio dependencies pointed at the test bed's copies of
                      the pinned module's charts (tests/testdata/istio-base-chart, istiod-chart) and
                      ours at charts/istio-cni, each by file:// and at that chart's own version;
                      then `helm dependency update` (resolves, writes Chart.lock) and `helm
                      dependency build` (rebuilds charts/ from the lock, as a user with a committed
                      lock does)
    testbed_values()  the values the test bed adds to the example's own values.yaml: under `base`
                      and `istiod` what testbed/istiod.py gives Istio's charts (webhooks by URL to
                      the host istiod, its images), under `istio-cni` the node's values
                      (testbed/chart.py), `global` merged from both of Istio's
    istio_crds() / delete_istio_crds()
                      Istio's CRDs, which `helm uninstall` keeps (Istio marks them
                      `helm.sh/resource-policy: keep`): a release of another name cannot install
                      them while they are there, so the test bed deletes those it left behind.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed.helm import CHART, Helm
from testbed.istiod import BASE_CHART, ISTIOD_CHART
from testbed.parts import REPO_ROOT
from testbed.wait import wait_for

EXAMPLE = REPO_ROOT / "examples" / "umbrella"
RELEASE = "istio"
ISTIO_REPOSITORY = "https://istio-release.storage.googleapis.com/charts"
LOCAL_CHARTS = {"base": BASE_CHART, "istiod": ISTIOD_CHART, "istio-cni": CHART}
ISTIO_CRD_GROUP_SUFFIX = ".istio.io"
RELEASE_ANNOTATION = "meta.helm.sh/release-name"


def chart_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])


def dependencies(chart: Path = EXAMPLE) -> list[dict[str, Any]]:
    deps: list[dict[str, Any]] = yaml.safe_load((chart / "Chart.yaml").read_text())["dependencies"]
    return deps


def offline_copy(helm: Helm, dest: Path) -> Path:
    """The example at `dest` (which must not exist), its dependencies built from local charts."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    meta = yaml.safe_load((dest / "Chart.yaml").read_text())
    for dep in meta["dependencies"]:
        local = LOCAL_CHARTS.get(dep["name"])
        if local is None:
            raise ValueError(f"{EXAMPLE}/Chart.yaml: no local chart for dependency {dep['name']}")
        dep["repository"] = f"file://{local}"
        dep["version"] = chart_version(local)
    (dest / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    helm.run("dependency", "update", str(dest))
    helm.run("dependency", "build", str(dest))
    return dest


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """`b` over `a`, maps merged key by key (as Helm merges values files)."""
    out = copy.deepcopy(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def testbed_values(
    base: dict[str, Any], istiod: dict[str, Any], agent: dict[str, Any]
) -> dict[str, Any]:
    """The umbrella's values from each chart's own: `base` and `istiod` are what the test bed
    gives Istio's charts installed alone, `agent` this chart's."""
    base_own = {k: v for k, v in base.items() if k != "global"}
    istiod_own = {k: v for k, v in istiod.items() if k != "global"}
    return {
        "global": _merged(base.get("global", {}), istiod.get("global", {})),
        "base": base_own,
        "istiod": istiod_own,
        "istio-cni": agent,
    }


def _extensions(core: Any) -> Any:
    return k8s.ApiextensionsV1Api(core.api_client)


def istio_crds(core: Any) -> dict[str, str]:
    """Istio's CRDs in the cluster: name -> the Helm release that installed them ("" for none)."""
    found = _extensions(core).list_custom_resource_definition().items
    return {
        crd.metadata.name: (crd.metadata.annotations or {}).get(RELEASE_ANNOTATION, "")
        for crd in found
        if crd.spec.group.endswith(ISTIO_CRD_GROUP_SUFFIX)
    }


def delete_istio_crds(core: Any, timeout: float = 60.0) -> None:
    """Delete every Istio CRD and wait until they are gone."""
    api = _extensions(core)
    for name in istio_crds(core):
        try:
            api.delete_custom_resource_definition(name)
        except ApiException as e:
            if e.status != 404:
                raise
    wait_for(lambda: not istio_crds(core), "Istio's CRDs gone", timeout)
