"""The test bed's API server: versions, pods bound to the simulated node, watches by node,
pytest-helm-charts' fixtures, and RBAC with a TokenRequest identity."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from testbed import parts
from testbed.controlplane import ControlPlane
from testbed.identity import Identity
from testbed.node import NodePods
from testbed.wait import wait_for

pytestmark = pytest.mark.cluster


def test_api_server_reports_the_pinned_release(kube_core: Any) -> None:
    version = k8s.VersionApi(kube_core.api_client).get_code()
    assert version.git_version == parts.kube_version()


def test_simulated_node_is_ready(kube_core: Any, sim_node: str) -> None:
    node = kube_core.read_node(sim_node)
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert [c.status for c in ready] == ["True"]


def test_pytest_helm_charts_fixtures_use_the_testbed(
    kube_cluster: Any, random_namespace_function_scope: Any, kube_core: Any
) -> None:
    import pykube

    names = [n.name for n in pykube.Namespace.objects(kube_cluster.kube_client)]
    assert random_namespace_function_scope.name in names
    assert kube_core.read_namespace(random_namespace_function_scope.name).status.phase == "Active"


def test_watch_by_node_sees_only_pods_bound_to_that_node(
    kube_core: Any, sim_node: str, node_pods: NodePods, random_namespace_function_scope: Any
) -> None:
    namespace = random_namespace_function_scope.name
    selector = f"spec.nodeName={sim_node}"
    start = kube_core.list_pod_for_all_namespaces(field_selector=selector)
    seen: list[tuple[str, str]] = []
    done = threading.Event()
    watcher = watch.Watch()

    def follow() -> None:
        for event in watcher.stream(
            kube_core.list_pod_for_all_namespaces,
            field_selector=selector,
            resource_version=start.metadata.resource_version,
            timeout_seconds=30,
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if event["object"].metadata.name == "on-node":
                done.set()
                watcher.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    # A pod on another node first: the watch must never deliver it.
    other = NodePods(kube_core, "node-2")
    try:
        other.create(namespace, "elsewhere")
        pod = node_pods.create(namespace, "on-node", labels={"app": "demo"})
        assert pod["spec"]["nodeName"] == sim_node
        assert done.wait(30), f"watch with {selector} did not deliver the pod; saw {seen}"
    finally:
        watcher.stop()
        other.close()
        thread.join(35)
    assert ("ADDED", "on-node") in seen
    assert all(name != "elsewhere" for _, name in seen)


def test_pod_status_can_be_reported_as_the_kubelet_does(
    node_pods: NodePods, random_namespace_function_scope: Any
) -> None:
    namespace = random_namespace_function_scope.name
    node_pods.create(namespace, "web")
    pod = node_pods.set_running(namespace, "web", "10.250.0.7")
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"] == "10.250.0.7"


def _rbac_fixture(kube_core: Any, namespace: str) -> None:
    """ServiceAccount `reader` that may get/list/watch pods in `namespace`, nothing else."""
    rbac: Any = k8s.RbacAuthorizationV1Api(kube_core.api_client)  # takes plain dicts
    kube_core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )


def test_token_request_identity_has_exactly_its_roles_verbs(
    kube_core: Any,
    node_pods: NodePods,
    make_identity: Callable[..., Identity],
    random_namespace_function_scope: Any,
) -> None:
    namespace = random_namespace_function_scope.name
    _rbac_fixture(kube_core, namespace)
    node_pods.create(namespace, "victim")
    identity = make_identity(namespace, "reader")
    api = k8s_config.new_client_from_config(config_file=str(identity.kubeconfig))
    try:
        review = k8s.AuthenticationV1Api(api).create_self_subject_review({})  # type: ignore[arg-type]  # the client takes plain dicts
        assert review.status and review.status.user_info
        assert review.status.user_info.username == identity.username
        as_reader: Any = k8s.CoreV1Api(api)
        assert [p.metadata.name for p in as_reader.list_namespaced_pod(namespace).items] == [
            "victim"
        ]
        with pytest.raises(ApiException) as denied:
            as_reader.delete_namespaced_pod("victim", namespace)
        assert denied.value.status == 403
        with pytest.raises(ApiException) as other_ns:
            as_reader.list_namespaced_pod("default")
        assert other_ns.value.status == 403
    finally:
        api.close()
    assert kube_core.read_namespaced_pod("victim", namespace).metadata.name == "victim"


def test_token_bound_to_a_pod_is_refused_once_the_pod_is_gone(
    kube_core: Any,
    node_pods: NodePods,
    make_identity: Callable[..., Identity],
    random_namespace_function_scope: Any,
) -> None:
    namespace = random_namespace_function_scope.name
    _rbac_fixture(kube_core, namespace)
    pod = node_pods.create(namespace, "agent", service_account="reader")
    identity = make_identity(
        namespace, "reader", bound_pod=(pod["metadata"]["name"], pod["metadata"]["uid"])
    )
    api = k8s_config.new_client_from_config(config_file=str(identity.kubeconfig))
    try:
        as_reader: Any = k8s.CoreV1Api(api)
        assert as_reader.list_namespaced_pod(namespace).items
        node_pods.delete(namespace, "agent")

        # The API server caches a token's review for a few seconds; then it is refused.
        def refused() -> int | None:
            try:
                as_reader.list_namespaced_pod(namespace)
            except ApiException as e:
                return int(e.status)
            return None

        status = wait_for(refused, "the deleted pod's token to be refused", 30, interval=0.5)
        assert status == 401
    finally:
        api.close()


def test_control_plane_sets_kubeconfig_for_the_session(control_plane: ControlPlane) -> None:
    import os

    assert os.environ["KUBECONFIG"] == str(control_plane.kubeconfig)
