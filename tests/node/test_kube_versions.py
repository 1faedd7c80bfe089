"""The `kubeversions` tier: the chart and the agent on a bed whose control plane and kubelet are
another Kubernetes release than the node tier's (ci/go/kubernetes): each release pinned in
ci/go/kubernetes-1.<minor> (parts.extra_kube_versions(); built by ci/setup-testbed), one bed per
release (testbed/realnode.py with parts.kube(version)), started for the module and stopped,
whatever happened, before the next release's. On each:

- test_chart_installs_and_a_sidecar_pod_is_captured: the API server and the Node's kubelet report
  the release, `helm install` (Helm 4) passes the chart's kubeVersion check against that server,
  the agent chains itself into the node's conflist, and a sidecar pod starts with Istio's rules
  in its network namespace;
- test_ambient_pod_enrolled: an ambient pod is enrolled (annotated, its netns handed to the
  ztunnel TEST DOUBLE, testbed/ztunnel_double.py; its outbound connection answered by it);
- test_helm_uninstall_leaves_the_node_byte_identical: every file of the node's CNI dirs (bytes,
  link targets, modes, owners) as before the install;
- test_istiod_injects_and_validation_passes: Istio's istiod (testbed/istiod.py) injects a
  Deployment's pod, native sidecar and `istio-validation`, which passes against our rules.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.check.platform import CHART_KUBE_VERSION, parse_version, satisfies
from testbed import chart as agent_mod
from testbed import images, kubepods, parts, podnet
from testbed.images import Image
from testbed.injected import (
    PROXY,
    VALIDATION,
    assert_outbound_captured,
    assert_validation_passed,
    connect_loop,
    deployment,
    injected_namespace,
    wait_deployment_pod,
    wait_injected_running,
)
from testbed.istiod import Istiod
from testbed.parts import MissingPartError
from testbed.process import PartFailedError
from testbed.realnode import RealCluster
from tests.node.test_ambient import assert_a_pod_enrolled_with_ztunnel, set_mode_label

pytestmark = [pytest.mark.node, pytest.mark.kubeversions]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
LOOP = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]


# These override the node tier's session fixtures (tests/node/conftest.py) for this module: its
# other fixtures (node_helm, workload_ns, ztunnel_socket, istiod) then run on this release's bed.
@pytest.fixture(scope="module", params=parts.extra_kube_versions())
def real_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealCluster]:
    version: str = request.param
    try:
        cluster = RealCluster(tmp_path_factory.mktemp(f"kube-{version}"), kube=parts.kube(version))
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        cluster.start()
        yield cluster
    except (PartFailedError, MissingPartError) as e:
        pytest.fail(f"Kubernetes {version}: {e}", pytrace=False)
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def node_core(real_cluster: RealCluster) -> Any:
    return real_cluster.core()


@pytest.fixture(scope="module")
def agent_image(real_cluster: RealCluster) -> images.Image:
    return real_cluster.images["istio-cni"]


def node_files(cluster: RealCluster) -> dict[str, tuple[int, int, int, bytes]]:
    """path -> (mode, uid, gid, content or link target) of everything in the node's CNI dirs."""
    found = {}
    for top in (cluster.cni_bin_dir, cluster.cni_conf_dir):
        for path in sorted([top, *top.rglob("*")]):
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                content = os.fsencode(path.readlink())
            elif stat.S_ISREG(st.st_mode):
                content = path.read_bytes()
            else:
                content = b""
            found[str(path)] = (st.st_mode, st.st_uid, st.st_gid, content)
    return found


def test_chart_installs_and_a_sidecar_pod_is_captured(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    version = real_cluster.kube.version
    served = k8s.VersionApi(node_core.api_client).get_code().git_version
    assert served == version
    kubelet = node_core.read_node(real_cluster.node_name).status.node_info.kubelet_version
    assert kubelet == version
    parsed = parse_version(served)
    assert parsed is not None and satisfies(parsed, CHART_KUBE_VERSION), served

    reference = agent_mod.conflist(real_cluster)
    agent = agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
    assert agent_mod.conflist(real_cluster)["plugins"][:-1] == reference["plugins"]
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.status.container_statuses[0].restart_count == 0, agent.logs(node_core)

    image = real_cluster.images["workload"].ref
    node_core.create_namespaced_pod(
        workload_ns, kubepods.pod_manifest("meshed", image, app_command=LOOP, sidecar=True)
    )
    meshed = kubepods.wait_running(node_core, workload_ns, "meshed")
    netns = real_cluster.pod_netns(meshed.uid)
    assert podnet.has_istio_rules(netns), podnet.saved_rules(netns)
    kubepods.wait_log_line(
        node_core,
        workload_ns,
        "meshed",
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a connection captured by the proxy double",
    )


def test_ambient_pod_enrolled(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    # ztunnel_socket comes first: its clean-up runs after the release is uninstalled.
    set_mode_label(node_core, workload_ns, "ambient")
    ambient = {"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)}
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image, ambient=ambient)
    assert_a_pod_enrolled_with_ztunnel(real_cluster, node_core, workload_ns, ztunnel_socket)


def test_helm_uninstall_leaves_the_node_byte_identical(
    real_cluster: RealCluster, node_helm: Any, node_core: Any, agent_image: Image
) -> None:
    before = node_files(real_cluster)
    helm = node_helm("4")
    agent_mod.install(helm, real_cluster, node_core, agent_image)
    agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
    assert node_files(real_cluster) != before, "the install changed nothing on the node"
    agent_mod.uninstall(helm, node_core)
    after = node_files(real_cluster)
    assert after.keys() == before.keys()
    changed = [path for path in before if after[path] != before[path]]
    assert not changed, changed


@pytest.mark.istiod
def test_istiod_injects_and_validation_passes(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    istiod: Istiod,
) -> None:
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    with injected_namespace(node_core, real_cluster.apps(), istiod) as namespace:
        manifest = deployment("web", real_cluster.images["workload"].ref, connect_loop())
        real_cluster.apps().create_namespaced_deployment(namespace, manifest)
        pod = wait_deployment_pod(node_core, namespace, "app=web", istiod)
        view = wait_injected_running(node_core, namespace, pod)
        pod = node_core.read_namespaced_pod(view.name, namespace)
        # istiod's auto-detection: every release here runs native sidecars.
        assert [c.name for c in pod.spec.init_containers or []] == [VALIDATION, PROXY]
        assert_validation_passed(node_core, namespace, pod)
        assert_outbound_captured(node_core, namespace, pod)
