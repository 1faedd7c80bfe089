"""Istio's own node agent on the real node, as a test oracle: Istio's `istio-cni` chart (the copy
of the pinned istio.io/istio module's chart in tests/testdata/istio-chart) installed by Helm with
the test bed's `install-cni` image (ci/build-testbed-images: Istio's install-cni and istio-cni
built from that module), pointed at the node's CNI dirs.

    install()      `helm install` of Istio's chart, then its DaemonSet's pod Ready on the node
                   (Istio's readiness: its plugin and conflist entry in place)
    ready_pod()    that pod, Running and Ready

Istio's agent keeps its sockets, logs and its plugin's kubeconfig (`istio-cni-kubeconfig`, with
the in-cluster address of the API server that the test bed's node routes, testbed/nodenet.py)
under the fixed node path /var/run/istio-cni: its chart has no value for it.
"""

from __future__ import annotations

from typing import Any

from testbed import istio_procfs, kubepods
from testbed.chart import ready_daemon_pod
from testbed.helm import Helm
from testbed.images import Image
from testbed.parts import REPO_ROOT
from testbed.realnode import RealCluster

CHART = REPO_ROOT / "tests" / "testdata" / "istio-chart"
RELEASE = "istio-cni-istio"
NAMESPACE = "kube-system"
SELECTOR = "k8s-app=istio-cni-node"
CONTAINER = "install-cni"
IMAGE_NAME = "install-cni"
READY_TIMEOUT = 120.0


def values(cluster: RealCluster, image: Image, **extra: Any) -> dict[str, Any]:
    """Istio's chart values for the test bed's node: its image (never pulled), the node's dirs
    (its layout's, RealCluster.node_dirs)."""
    dirs = cluster.node_dirs
    return {
        "hub": image.hub,
        "tag": image.tag,
        "image": IMAGE_NAME,
        "pullPolicy": "Never",
        "cniBinDir": dirs.cni_bin,
        "cniConfDir": dirs.cni_conf,
        "cniNetnsDir": dirs.netns,
        "logging": {"level": "debug"},
        **extra,
    }


def install(
    helm: Helm, cluster: RealCluster, core: Any, image: Image, **extra: Any
) -> kubepods.PodView:
    """With ambient on, the /proc volume is a stand-in (testbed/istio_procfs.py: why)."""
    ambient = bool(extra.get("ambient", {}).get("enabled"))
    helm.install(
        RELEASE,
        CHART,
        namespace=NAMESPACE,
        values=values(cluster, image, **extra),
        post_renderer=istio_procfs.post_renderer(cluster.base) if ambient else None,
    )
    return ready_pod(core, cluster, image)


def pods(core: Any) -> list[Any]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items)


def ready_pod(core: Any, cluster: RealCluster, image: Image) -> kubepods.PodView:
    return ready_daemon_pod(
        core,
        cluster,
        namespace=NAMESPACE,
        selector=SELECTOR,
        container=CONTAINER,
        what="Istio's agent pod",
        image=image,
        timeout=READY_TIMEOUT,
    )


def wait_gone(core: Any, timeout: float = 90.0) -> None:
    kubepods.wait_for(lambda: not pods(core), "Istio's agent pods to be gone", timeout)


def uninstall(helm: Helm, core: Any) -> None:
    """`helm uninstall` of Istio's release, then its agent pods gone (its clean-up done)."""
    helm.uninstall(RELEASE, namespace=NAMESPACE)
    wait_gone(core)
