"""Helm installs the chart into the test bed's API server, the objects it created read back, and
the agent's ServiceAccount gets exactly the chart's RBAC (TokenRequest identity)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from testbed import parts
from testbed.helm import Helm
from testbed.identity import Identity

pytestmark = [pytest.mark.chart, pytest.mark.cluster]

CHART = parts.REPO_ROOT / "charts" / "istio-cni"


def _helm_versions() -> list[str]:
    # Collected before any fixture runs; a missing Helm still yields a test, which then fails.
    try:
        return sorted(parts.helm_binaries())
    except parts.MissingPartError:
        return ["missing"]


def _manifest_objects(helm: Helm, release: str, namespace: str) -> list[dict[str, Any]]:
    text = helm.run("get", "manifest", release, "--namespace", namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("helm_version", _helm_versions())
def test_helm_install_creates_readable_objects_with_least_privilege(
    helm_version: str,
    helm_binaries: dict[str, Path],
    helm_releases: Callable[[Path], Helm],
    kube_core: Any,
    make_identity: Callable[..., Identity],
    random_namespace_function_scope: Any,
) -> None:
    namespace = random_namespace_function_scope.name
    helm = helm_releases(helm_binaries[helm_version])
    release = f"cni-{helm_version.split('.')[0]}"
    answer = helm.install(release, CHART, namespace=namespace, values={"platform": "kind"})
    assert answer["info"]["status"] == "deployed"

    objects = _manifest_objects(helm, release, namespace)
    kinds = {o["kind"] for o in objects}
    assert {
        "DaemonSet",
        "ConfigMap",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    } <= kinds
    dynamic = DynamicClient(kube_core.api_client)
    for obj in objects:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj["metadata"].get("namespace", namespace) if resource.namespaced else None
        live = resource.get(name=obj["metadata"]["name"], namespace=ns)
        assert live.metadata.name == obj["metadata"]["name"]

    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    live_cm = kube_core.read_namespaced_config_map(configmap["metadata"]["name"], namespace)
    assert "config.yaml" in live_cm.data
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]

    identity = make_identity(namespace, account)
    api = k8s_config.new_client_from_config(config_file=str(identity.kubeconfig))
    try:
        as_agent = k8s.CoreV1Api(api)
        # What the agent needs: watch the pods of its node.
        as_agent.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1", limit=1)
        # What the chart does not grant it (repair mode is repair-in-place here).
        for call in (
            lambda: as_agent.delete_collection_namespaced_pod(namespace),
            lambda: as_agent.list_namespaced_secret(namespace),
            lambda: as_agent.create_namespace({"metadata": {"name": "agent-made"}}),  # type: ignore[arg-type]
        ):
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403
    finally:
        api.close()
