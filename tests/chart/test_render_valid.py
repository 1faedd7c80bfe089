"""Default values and every preset: `helm lint --strict` is clean and every rendered manifest is
valid, strictly, for Kubernetes 1.29 and 1.37 (ci/validate-manifests, the same check ci/demo runs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.helm import Helm
from testbed.parts import REPO_ROOT
from tests.chart.conftest import PLATFORMS, platform_values

pytestmark = pytest.mark.chart

PRESETS = ("default", *PLATFORMS)
VALIDATE = REPO_ROOT / "ci" / "validate-manifests"


def test_every_platform_of_the_issue_has_a_values_file() -> None:
    assert set(PLATFORMS) == {
        "gke",
        "openshift",
        "eks",
        "aks",
        "iks",
        "k3s",
        "k3d",
        "microk8s",
        "minikube",
        "kind",
        "rke2",
    }


def test_helm_binary_is_the_version_setup_helm_pinned(helm: Helm) -> None:
    reported = helm.run("version", "--template", "{{.Version}}").strip()
    assert reported == f"v{helm.version}"


@pytest.mark.parametrize("preset", PRESETS)
def test_lint_strict_is_clean(helm: Helm, preset: str) -> None:
    args = ["lint", "--strict", str(REPO_ROOT / "charts" / "istio-cni")]
    for f in platform_values(preset):
        args += ["--values", str(f)]
    out = helm.run(*args)
    assert "0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("preset", PRESETS)
def test_rendered_manifests_are_valid_for_kubernetes_1_29_and_1_37(
    helm: Helm, preset: str, tmp_path: Path
) -> None:
    rendered = tmp_path / "manifests.yaml"
    rendered.write_text(helm.template(values=platform_values(preset)).stdout)
    proc = subprocess.run(
        [sys.executable, str(VALIDATE), "--kube", "1.29", "--kube", "1.37", str(rendered)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INVALID" not in proc.stdout
    # Every document was checked against both versions.
    assert "DaemonSet/istio-cni" in proc.stdout and " 1.29 " in proc.stdout
    assert " 1.37 " in proc.stdout


def test_validator_rejects_a_field_the_kubernetes_version_lacks(helm: Helm, tmp_path: Path) -> None:
    # appArmorProfile exists from Kubernetes 1.30: strict validation for 1.29 must name it.
    rendered = tmp_path / "manifests.yaml"
    rendered.write_text(helm.template(sets=["appArmorProfile.type=Unconfined"]).stdout)
    proc = subprocess.run(
        [sys.executable, str(VALIDATE), "--kube", "1.29", "--kube", "1.37", str(rendered)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "INVALID 1.29  DaemonSet/istio-cni" in proc.stdout
    assert "appArmorProfile" in proc.stdout
    assert "INVALID 1.37" not in proc.stdout
