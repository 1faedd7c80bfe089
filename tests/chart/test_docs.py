"""The chart README is generated from the values comments and is up to date; every value has a
comment; NOTES.txt tells what was installed and how to check it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.helm import CHART, Helm
from testbed.parts import REPO_ROOT, cache_dir
from tests.chart.conftest import EXAMPLES

pytestmark = pytest.mark.chart

CHART_README = REPO_ROOT / "ci" / "chart-readme"


def run_readme(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "ci" / "chart-readme"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_chart_readme_is_up_to_date() -> None:
    proc = run_readme(REPO_ROOT, "--check")
    assert proc.returncode == 0, proc.stderr


def test_readme_lists_every_top_level_value_and_preset() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in values:
        assert f"| `{key}` |" in readme, key
    for platform in EXAMPLES.glob("*.yaml"):
        assert f"| `{platform.stem}` |" in readme


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """The files ci/chart-readme reads, in a scratch tree it may write to."""
    root = tmp_path / "repo"
    shutil.copytree(CHART, root / "charts" / "istio-cni")
    shutil.copytree(EXAMPLES, root / "values-examples")
    (root / "ci").mkdir()
    shutil.copy2(CHART_README, root / "ci" / "chart-readme")
    return root


def test_check_fails_naming_the_readme_when_a_comment_changed(repo_copy: Path) -> None:
    values = repo_copy / "charts" / "istio-cni" / "values.yaml"
    values.write_text(values.read_text().replace("Pods in these namespaces", "Pods in those"))
    proc = run_readme(repo_copy, "--check")
    assert proc.returncode == 1
    assert "README.md is out of date" in proc.stderr and "Pods in those" in proc.stderr
    assert run_readme(repo_copy).returncode == 0
    assert run_readme(repo_copy, "--check").returncode == 0


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("# -- Overrides the chart name in resource names.\n", "", "nameOverride"),
        ("  # -- Value of that label.\n", "", "repair.labelValue"),
    ],
    ids=["top-level", "nested"],
)
def test_a_value_without_comment_is_an_error_naming_it(
    repo_copy: Path, old: str, new: str, key: str
) -> None:
    values = repo_copy / "charts" / "istio-cni" / "values.yaml"
    text = values.read_text()
    assert old in text
    values.write_text(text.replace(old, new))
    proc = run_readme(repo_copy)
    assert proc.returncode == 1
    assert f"value {key} has no '# --' comment" in proc.stderr


@pytest.fixture
def helm4(tmp_path: Path) -> Helm:
    # Helm 4 renders NOTES.txt in a client-only dry run; Helm 3 would need a cluster for that.
    binary = cache_dir() / "helm" / "4.1.4" / "helm"
    if not binary.exists():
        pytest.fail(f"Helm 4.1.4 missing at {binary}: run ci/setup-helm", pytrace=False)
    return Helm(binary=binary, version="4.1.4", home=tmp_path / "helm-home")


def notes(helm: Helm, *sets: str) -> str:
    args = ["install", "istio-cni", str(CHART), "--namespace", "kube-system", "--dry-run=client"]
    for s in sets:
        args += ["--set", s]
    out = helm.run(*args)
    return out[out.index("NOTES:") :]


def test_notes_say_what_was_installed_and_how_to_check_it(helm4: Helm) -> None:
    text = notes(helm4)
    assert "DaemonSet istio-cni" in text
    assert "kubectl -n kube-system rollout status daemonset/istio-cni" in text
    # The failing check of a pod not READY, not the log of one arbitrary pod of the DaemonSet.
    assert "logs daemonset/" not in text and "READY" in text
    assert "kubectl get --raw /api/v1/namespaces/kube-system/pods/<pod>:15014/proxy/readyz" in text
    assert "/var/run/netns holding the pods' namespaces" in text  # what readiness checks
    assert "/opt/cni/bin" in text and "chains it into" in text


def test_notes_name_what_the_preset_replaced(helm4: Helm) -> None:
    text = notes(helm4, "platform=openshift", "chained=true")
    assert "The platform preset openshift replaced these values" in text
    assert "  - chained: false (default true)" in text
    assert "-f values-examples/openshift.yaml" in text


def test_notes_name_the_platform_parts(helm4: Helm) -> None:
    text = notes(helm4, "platform=openshift")
    assert "platform preset: openshift" in text
    assert "NetworkAttachmentDefinition istio-cni" in text
    assert "system:openshift:scc:privileged" in text
    assert "/etc/cni/multus/net.d/istio-cni.conf" in text


def test_every_value_is_typed_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False  # a misspelt value is an error

    def walk(data: dict[str, object], node: dict[str, object], prefix: str) -> None:
        props = node.get("properties")
        assert isinstance(props, dict), f"{prefix or 'values'}: schema has no properties"
        for key, value in data.items():
            path = f"{prefix}{key}"
            assert key in props, f"value {path} is not in values.schema.json"
            typed = props[key].get("type") or props[key].get("$ref")  # a Kubernetes type
            assert typed, f"value {path} has no type in values.schema.json"
            if isinstance(value, dict) and "properties" in props[key]:
                walk(value, props[key], f"{path}.")

    walk(values, schema, "")


def test_kubernetes_types_in_the_schema_are_up_to_date() -> None:
    # ci/chart-schema writes them from the OpenAPI document of the Kubernetes release the test
    # bed builds (ci/go/kubernetes/go.mod), found in the Go module cache.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "ci" / "chart-schema"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_every_kubernetes_typed_value_refers_to_its_kubernetes_type() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    props = schema["properties"]
    refs = {
        "tolerations": props["tolerations"]["items"]["$ref"],
        "affinity": props["affinity"]["$ref"],
        "resources": props["resources"]["$ref"],
        "imagePullSecrets": props["imagePullSecrets"]["items"]["anyOf"][1]["$ref"],
    }
    for value, ref in refs.items():
        name = ref.removeprefix("#/definitions/")
        assert name.startswith("io.k8s.api.core.v1."), (value, ref)
        assert name in schema["definitions"], (value, ref)


def test_upgrade_advice_never_recommends_reuse_values() -> None:
    """--reuse-values carries the old chart's defaults over: with the closed schema a key a
    release drops fails the upgrade. The docs say to pass values again or reset-then-reuse, and
    how to roll back."""
    for doc in (REPO_ROOT / "README.md", CHART / "docs" / "versioning.md"):
        text = " ".join(doc.read_text().split())
        assert "--reset-then-reuse-values" in text, doc
        assert "rollback istio-cni 0" in text, doc
        for at in [m.start() for m in re.finditer("--reuse-values", text)]:
            assert re.search(r"\b(not|Not)\b", text[max(0, at - 30) : at]), text[at - 80 : at + 20]


def test_numbers_in_the_docs_are_the_code_s() -> None:
    """The heal spacing under a fight and the pod cache's watch cadence, as the docs and the
    alerts state them, are the agent's."""
    from agent.install.conflicts import FIGHT_HEAL_INTERVAL

    values = (CHART / "values.yaml").read_text()
    observability = (CHART / "docs" / "observability.md").read_text()
    for text in (
        values,
        observability,
        (REPO_ROOT / "docs/runbooks/IstioCniConfigConflict.md").read_text(),
    ):
        flat = " ".join(text.replace("#", " ").split())  # values.yaml's comments as prose
        spacing = re.findall(r"at least ([0-9.]+) s apart", flat)
        assert spacing and all(float(s) == FIGHT_HEAL_INTERVAL for s in spacing), spacing
    alerts = (CHART / "files" / "alerts.yaml").read_text()
    assert "lists again every" not in alerts + observability  # the caches list on no timer
