"""The `kubeversions` tier: the chart and the agent on a bed whose control plane and kubelet are
another Kubernetes release than the node tier's (ci/go/kubernetes): each release pinned in
ci/go/kubernetes-1.<minor> (parts.extra_kube_versions(); built by ci/setup-testbed), one bed per
release (testbed/realnode.py with parts.kube(version)), started for the module and stopped,
whatever happened, before the next release's. On each:

- the node tier's and the istiod tier's own tests, the same functions (TAKEN below): the chart
  installed with Helm 3 and 4, a sidecar pod captured and a plain one untouched, `helm uninstall`
  restoring the node, pods waiting for the agent across a restart and repaired after it, an ambient
  pod enrolled with the ztunnel TEST DOUBLE (testbed/ztunnel_double.py); istiod (testbed/istiod.py)
  injecting pods whose `istio-validation` passes, that validation failing without the agent and
  each repair mode handling it, every injected variant, and the node's taint;
- test_chart_installs_and_a_sidecar_pod_is_captured: the API server and the Node's kubelet report
  the release and `helm install` passes the chart's kubeVersion check against that server;
- test_helm_uninstall_leaves_the_node_byte_identical: every file of the node's CNI dirs (bytes,
  link targets, modes, owners) as before the install.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.check.platform import CHART_KUBE_VERSION, parse_version, satisfies
from testbed import chart as agent_mod
from testbed import images, kubepods, parts, podnet
from testbed.images import Image
from testbed.parts import MissingPartError
from testbed.process import PartFailedError
from testbed.realnode import RealCluster
from tests.node import (
    test_ambient,
    test_install,
    test_istiod,
    test_restart,
    test_traffic,
    test_uninstall,
)

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


# The node tier's and the istiod tier's own tests, the same functions, collected here as well:
# with this module's fixtures above they run on each release's bed, the istiod tier's on its
# containerd 1.6 (tests/node/test_istiod.py lays the session's node out on containerd 2). The
# fixtures of their modules that they take come with them.
TAKEN: dict[ModuleType, tuple[str, ...]] = {
    test_install: ("test_helm_install_runs_the_agent_on_the_node",),
    test_traffic: ("test_sidecar_pod_captured_plain_pod_untouched",),
    test_uninstall: ("test_helm_uninstall_restores_the_node",),
    test_restart: (
        "agent_image_back",
        "test_after_restart_pods_wait_for_the_agent",
        "test_pod_started_before_the_agent_is_repaired",
    ),
    test_ambient: ("plain_ns", "test_ambient_pod_enrolled_captured_probed_and_released"),
    test_istiod: (
        "injected_ns",
        "test_istiod_injects_validation_passes_traffic_captured",
        "test_validation_fails_without_the_agent_and_repair_handles_the_pod",
        "test_injected_variants_validated_captured_and_programmed_as_rules_pod_prints",
        "test_istiod_untaints_the_node_once_the_agent_is_ready_and_the_agent_does_not_fight_it",
    ),
}
for _module, _names in TAKEN.items():
    globals().update({name: getattr(_module, name) for name in _names})


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
