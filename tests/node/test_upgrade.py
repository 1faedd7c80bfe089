"""`helm upgrade` to a new image tag (`ci/build-image --tag T`) while sidecar pods keep being
created: the DaemonSet replaces the agent's pod, and meanwhile no pod starts uncaptured (each
one's connections reach its proxy from the first), none fails for good (a refused ADD while no
agent serves is retried by kubelet), our entry never leaves the node's conflist, and the new
agent pod leaves that file alone: its entry names the DaemonSet, not the pod."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

UPGRADE_TAG = "node-upgrade"
OUTSIDE = "203.0.113.10"
POD_INTERVAL = 1.0
PODS_AFTER_UPGRADE = 3


class ConflistWatch(threading.Thread):
    """Reads the conflist every few ms; records every moment our entry was not last in it."""

    def __init__(self, cluster: RealCluster) -> None:
        super().__init__(name="conflist-watch", daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()
        self.reads = 0
        self.missing: list[str] = []
        self.versions: set[tuple[int, int]] = set()
        """(inode, mtime) of every version of the file seen: a rewrite makes a new one."""

    def run(self) -> None:
        while not self.stop.wait(0.01):
            try:
                stat = self.cluster.conflist_path.stat()
                self.versions.add((stat.st_ino, stat.st_mtime_ns))
                plugins = json.loads(self.cluster.conflist_path.read_text())["plugins"]
            except (OSError, ValueError) as e:
                self.missing.append(f"unreadable: {e}")
                continue
            self.reads += 1
            if plugins[-1].get("type") != "istio-cni":
                self.missing.append(json.dumps(plugins))


class PodCreator(threading.Thread):
    """Creates a sidecar pod every POD_INTERVAL s until stopped."""

    def __init__(self, core: Any, namespace: str, image: str) -> None:
        super().__init__(name="pod-creator", daemon=True)
        self.core, self.namespace, self.image = core, namespace, image
        self.stop = threading.Event()
        self.names: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            name = f"up-{len(self.names):03d}"
            try:
                self.core.create_namespaced_pod(
                    self.namespace,
                    kubepods.pod_manifest(
                        name,
                        self.image,
                        app_command=["connect-loop", OUTSIDE, "80", "0.5"],
                        sidecar=True,
                    ),
                )
                self.names.append(name)
            except Exception as e:
                self.errors.append(f"{name}: {e}")
            self.stop.wait(POD_INTERVAL)


@pytest.fixture(scope="module")
def next_image(agent_image: Image) -> Image:
    """The agent image under a new tag, built by ci/build-image (cached when unchanged)."""
    try:
        return images.build_agent_image(UPGRADE_TAG)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


def test_upgrade_while_pods_start(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    next_image: Image,
    workload_ns: str,
) -> None:
    assert next_image.ref != agent_image.ref
    real_cluster.import_image(next_image)
    helm = node_helm("4")
    old = agent_mod.install(helm, real_cluster, node_core, agent_image)
    agent_mod.wait_conflist(real_cluster, lambda c: c["plugins"][-1]["type"] == "istio-cni")
    before = real_cluster.conflist_path.read_bytes()

    watch = ConflistWatch(real_cluster)
    creator = PodCreator(node_core, workload_ns, real_cluster.images["workload"].ref)
    watch.start()
    creator.start()
    try:
        kubepods.wait_for(lambda: len(creator.names) >= 2, "pods created before the upgrade", 30)
        helm.upgrade(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=agent_mod.node_values(real_cluster, next_image),
        )
        new = agent_mod.ready_agent(node_core, real_cluster, image=next_image)
        upgraded_at = len(creator.names)
        kubepods.wait_for(
            lambda: len(creator.names) >= upgraded_at + PODS_AFTER_UPGRADE,
            "pods created after the upgrade",
            60,
        )
    finally:
        creator.stop.set()
        creator.join()
    assert new.pod.name != old.pod.name
    assert not creator.errors, creator.errors

    # Every pod started (retries allowed), captured from its first connection on.
    started = time.monotonic()
    for name in creator.names:
        pod = kubepods.wait_running(
            node_core, workload_ns, name, timeout=max(10.0, 180 - (time.monotonic() - started))
        )
        assert podnet.has_istio_rules(real_cluster.pod_netns(pod.uid)), name
        line = kubepods.wait_log_line(
            node_core, workload_ns, name, "app", lambda s: "connect " in s, "a connection"
        )
        assert "proxy-double port=15001" in line or "Connection refused" in line, (name, line)
        app_log = kubepods.logs(node_core, workload_ns, name, "app")
        assert not any(kubepods.escaped(s) for s in app_log.splitlines()), (name, app_log[-1500:])
    watch.stop.set()
    watch.join()
    assert watch.reads > 100
    assert not watch.missing, watch.missing[:5]
    # A rollout that changes only the agent pod (and its image) does not rewrite the node's
    # primary CNI config: one version of the file the whole time, the same bytes as before.
    assert len(watch.versions) == 1, watch.versions
    assert real_cluster.conflist_path.read_bytes() == before
