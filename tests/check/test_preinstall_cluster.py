"""`check --pre` against the real API server, each warning and failure made to happen."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.check.conftest import Objects, run_check

pytestmark = pytest.mark.cluster

ENFORCE = "pod-security.kubernetes.io/enforce"


def test_a_privileged_namespace_passes(kube_config: str, objects: Objects) -> None:
    ns = objects.namespace({ENFORCE: "privileged"})
    code, checks, text = run_check("--pre", "-n", ns, "--kubeconfig", kube_config)
    assert checks["pod-security"]["status"] == "pass"
    assert checks["kubernetes-version"]["status"] == "pass"
    assert checks["priority-quota"]["status"] == "pass"  # not GKE
    assert checks["istio-node-agent"]["status"] == "pass"
    assert checks["cilium-exclusive"]["status"] == "pass"
    assert code == 0, text
    assert "PASS  pod-security" in text


def test_a_baseline_namespace_fails_with_the_label_to_set(
    kube_config: str, objects: Objects
) -> None:
    ns = objects.namespace({ENFORCE: "baseline"})
    code, checks, text = run_check("--pre", "-n", ns, "--kubeconfig", kube_config)
    assert code == 1
    check = checks["pod-security"]
    assert check["status"] == "fail"
    assert check["details"] == [f"{ns}: {ENFORCE}=baseline"]
    assert check["fix"] == f"kubectl label namespace {ns} {ENFORCE}=privileged --overwrite"
    assert "FAIL  pod-security" in text and "fix: kubectl label namespace" in text


def test_gke_needs_a_quota_for_node_critical_pods_outside_kube_system(
    kube_config: str, kube_core: Any, objects: Objects
) -> None:
    objects.node("gke", labels={"cloud.google.com/gke-nodepool": "default-pool"})
    ns = objects.namespace()
    _, checks, _ = run_check("--pre", "-n", ns, "--kubeconfig", kube_config)
    assert checks["priority-quota"]["status"] == "warn"
    assert ns in checks["priority-quota"]["message"]
    assert "resourceQuota.enabled=true" in checks["priority-quota"]["fix"]
    _, checks, _ = run_check("--pre", "-n", "kube-system", "--kubeconfig", kube_config)
    assert checks["priority-quota"]["status"] == "pass"
    kube_core.create_namespaced_resource_quota(
        ns,
        {
            "metadata": {"name": "critical-pods"},
            "spec": {
                "hard": {"pods": "1000"},
                "scopeSelector": {
                    "matchExpressions": [
                        {
                            "operator": "In",
                            "scopeName": "PriorityClass",
                            "values": ["system-node-critical"],
                        }
                    ]
                },
            },
        },
    )
    _, checks, _ = run_check("--pre", "-n", ns, "--kubeconfig", kube_config)
    assert checks["priority-quota"]["status"] == "pass"


def test_istios_own_agent_fails_naming_the_migration(kube_config: str, objects: Objects) -> None:
    istio_ns = objects.namespace()
    objects.daemonset(
        istio_ns,
        "istio-cni-node",
        labels={"k8s-app": "istio-cni-node", "app.kubernetes.io/managed-by": "Helm"},
        annotations={"meta.helm.sh/release-name": "istio-cni"},
    )
    code, checks, _ = run_check("--pre", "--kubeconfig", kube_config)
    assert code == 1
    check = checks["istio-node-agent"]
    assert check["status"] == "fail"
    assert check["details"] == [f"{istio_ns}/istio-cni-node: Helm release istio-cni, 0 pods ready"]
    assert f"helm uninstall istio-cni -n {istio_ns}" in check["fix"]
    assert "Migrating from Istio's CNI on a live cluster" in check["fix"]


def test_istioctl_installed_agent_names_istioctls_step(kube_config: str, objects: Objects) -> None:
    objects.daemonset(
        objects.namespace(),
        "istio-cni-node",
        labels={"k8s-app": "istio-cni-node", "install.operator.istio.io/owning-resource": "iop"},
    )
    _, checks, _ = run_check("--pre", "--kubeconfig", kube_config)
    assert "components.cni.enabled=false" in checks["istio-node-agent"]["fix"]


@pytest.mark.parametrize(
    ("value", "status"), [("true", "fail"), ("false", "pass")], ids=["exclusive", "not-exclusive"]
)
def test_cilium_cni_exclusive(
    kube_config: str, kube_core: Any, objects: Objects, value: str, status: str
) -> None:
    ns = objects.namespace()
    kube_core.create_namespaced_config_map(
        ns, {"metadata": {"name": "cilium-config"}, "data": {"cni-exclusive": value}}
    )
    for pre in (["--pre"], []):
        _, checks, _ = run_check(*pre, "--kubeconfig", kube_config)
        assert checks["cilium-exclusive"]["status"] == status
    if status == "fail":
        assert "cni.exclusive=false" in checks["cilium-exclusive"]["fix"]


def _injector(core: Any, ns: str, values: dict[str, Any], template: str) -> None:
    core.create_namespaced_config_map(
        ns,
        {
            "metadata": {"name": "istio-sidecar-injector", "labels": {"istio.io/rev": "default"}},
            "data": {"values": json.dumps(values), "config": template},
        },
    )


MODERN = "{{- if .Values.pilot.cni.enabled }}istio-validation{{ else }}istio-init{{ end }}"
LEGACY = "{{- if .Values.istio_cni.enabled }}istio-validation{{ else }}istio-init{{ end }}"


@pytest.mark.parametrize(
    ("values", "template", "pre", "post"),
    [
        ({"pilot": {"cni": {"enabled": False}}}, MODERN, "pass", "fail"),
        ({"pilot": {"cni": {"enabled": True}}}, MODERN, "warn", "pass"),
        (
            {"istio_cni": {"enabled": False}, "pilot": {"cni": {"enabled": True}}},
            LEGACY,
            "pass",
            "fail",
        ),
        ({"istio_cni": {"enabled": True}}, LEGACY, "warn", "pass"),
    ],
    ids=["off", "on", "legacy-off", "legacy-on"],
)
def test_istiod_cni_setting_read_as_its_template_reads_it(
    kube_config: str,
    kube_core: Any,
    objects: Objects,
    values: dict[str, Any],
    template: str,
    pre: str,
    post: str,
) -> None:
    ns = objects.namespace()
    _injector(kube_core, ns, values, template)
    _, checks, _ = run_check("--pre", "--kubeconfig", kube_config)
    assert checks["istiod-cni"]["status"] == pre, checks["istiod-cni"]
    assert any(
        d.startswith(f"{ns}/istio-sidecar-injector: ") for d in checks["istiod-cni"]["details"]
    )
    code, checks, _ = run_check("--kubeconfig", kube_config)
    assert checks["istiod-cni"]["status"] == post
    if post == "fail":
        assert "pilot.cni.enabled=true" in checks["istiod-cni"]["fix"]
        assert code == 1


def test_no_istiod_is_a_warning(kube_config: str) -> None:
    _, checks, _ = run_check("--pre", "--kubeconfig", kube_config)
    assert checks["istiod-cni"]["status"] == "warn"
