"""The umbrella of `examples/umbrella/` on the real node: one `helm install` of Istio's `base` and
`istiod` charts with this chart as dependencies, with the example's own values file (which alone
switches istiod to the agent, `istiod.pilot.cni.enabled`, and installs the agent,
`istio_cni.enabled`); istiod injects a Deployment and the agent captures it; one `helm uninstall`
removes all three and leaves the node's CNI config byte-identical.

Istio's charts come from the test bed's copies of the pinned module (testbed/umbrella.py, no
network); istiod runs on the host as in the rest of the `istiod` tier (testbed/istiod.py), started
from the Deployment the umbrella installed. A module of its own: the release holds the same
objects as the standalone `istio-base` and `istiod` releases of tests/node/test_istiod.py.
On containerd 2, the node laid out as kind's (tests/node/conftest.py on_containerd2)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, umbrella
from testbed.helm import uninstall_all
from testbed.images import Image
from testbed.injected import (
    PROXY,
    VALIDATION,
    assert_inbound_captured,
    assert_outbound_captured,
    assert_validation_passed,
    connect_loop,
    deployment,
    injected_namespace,
    wait_deployment_pod,
    wait_injected_running,
)
from testbed.istiod import NAMESPACE, Istiod
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.istiod, pytest.mark.usefixtures("on_containerd2")]


@pytest.fixture
def istiod_for_umbrella(
    real_cluster: RealCluster, node_helm: Any, node_core: Any, tmp_path: Path
) -> Iterator[Istiod]:
    """istiod's certificates and namespace, not yet its charts (the umbrella installs them with
    `control.helm`) nor its process. At the end: a release left installed is uninstalled before
    istiod stops and its namespace goes, then Istio's CRDs are deleted (Helm keeps them, and
    another release could not install them while they are there)."""
    proxy = images.image("proxy")
    real_cluster.import_image(proxy)
    control = Istiod(real_cluster, node_helm("4"), proxy, tmp_path / "istiod")
    umbrella.delete_istio_crds(node_core)  # left by an earlier release of Istio's base chart
    try:
        control.make_certificates()
        control.make_namespace()
        yield control
    finally:
        errors = uninstall_all([control.helm])
        with contextlib.suppress(AssertionError):
            agent_mod.wait_agent_gone(node_core, namespace=NAMESPACE)
        control.stop()
        umbrella.delete_istio_crds(node_core)
        assert not errors, errors


def test_one_release_installs_istio_and_the_agent_and_uninstall_restores_the_node(
    real_cluster: RealCluster,
    node_core: Any,
    agent_image: Image,
    istiod_for_umbrella: Istiod,
    tmp_path: Path,
) -> None:
    control = istiod_for_umbrella
    before = real_cluster.conflist_path.read_bytes()
    helm = control.helm
    chart = umbrella.offline_copy(helm, tmp_path / "umbrella")
    istiod_values = control.istiod_chart_values()
    # The example's values.yaml, not the test bed, must be what switches istiod to the agent.
    istiod_values["pilot"].pop("cni")
    values = umbrella.testbed_values(
        control.base_chart_values(),
        istiod_values,
        agent_mod.node_values(real_cluster, agent_image),
    )
    helm.install(umbrella.RELEASE, chart, namespace=NAMESPACE, values=values)
    control.run_on_host()
    agent_mod.ready_agent(node_core, real_cluster, image=agent_image, namespace=NAMESPACE)

    with injected_namespace(node_core, real_cluster.apps(), control) as ns:
        manifest = deployment("web", real_cluster.images["workload"].ref, connect_loop())
        real_cluster.apps().create_namespaced_deployment(ns, manifest)
        made = wait_deployment_pod(node_core, ns, "app=web", control)
        view = wait_injected_running(node_core, ns, made)
        pod = node_core.read_namespaced_pod(view.name, ns)
        inits = [c.name for c in pod.spec.init_containers or []]
        assert inits == [VALIDATION, PROXY], inits
        assert_validation_passed(node_core, ns, pod)
        assert_outbound_captured(node_core, ns, pod)
        assert_inbound_captured(real_cluster.network.netns_path, pod)

    helm.uninstall(umbrella.RELEASE, namespace=NAMESPACE)
    agent_mod.wait_agent_gone(node_core, namespace=NAMESPACE)
    assert real_cluster.conflist_path.read_bytes() == before
    assert not (real_cluster.host_path(real_cluster.node_dirs.cni_bin) / "istio-cni").exists()
    apps = real_cluster.apps()
    assert not apps.list_namespaced_deployment(NAMESPACE).items, "istiod's Deployment left"
    assert not apps.list_namespaced_daemon_set(NAMESPACE).items, "the agent's DaemonSet left"
