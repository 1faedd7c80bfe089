"""The chart on the real node: install it, wait for the DaemonSet's pod to be Ready (the kubelet's
readiness probe passed), and look at what the agent did to the node's CNI dirs."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed import kubepods
from testbed.containerd import Containerd
from testbed.helm import CHART as CHART  # the one chart path; chart.CHART for callers
from testbed.helm import Helm
from testbed.images import Image
from testbed.realnode import RealCluster

RELEASE = "istio-cni"
AGENT_NAMESPACE = "kube-system"
AGENT_SELECTOR = "app.kubernetes.io/name=istio-cni"
AGENT_CONTAINER = "istio-cni-agent"
READY_TIMEOUT = 120.0
# How a warning or an error line looks in our log (logfmt) and in Istio's (tab-separated).
NOTED_LEVELS = ("level=warn", "level=error", "\twarn\t", "\terror\t")


def node_values(cluster: RealCluster, image: Image, **extra: Any) -> dict[str, Any]:
    """Chart values for the test bed's node: its image (never pulled) and the node's dirs (its
    layout's, RealCluster.node_dirs)."""
    dirs = cluster.node_dirs
    return {
        "hub": image.hub,
        "tag": image.tag,
        "pullPolicy": "Never",
        "cniBinDir": dirs.cni_bin,
        "cniConfDir": dirs.cni_conf,
        "cniNetnsDir": dirs.netns,
        "cniAgentRunDir": str(cluster.agent_run_dir),
        "logLevel": "debug",
        **extra,
    }


def agent_pods(core: Any, namespace: str = AGENT_NAMESPACE) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=AGENT_SELECTOR).items)


def wait_agent_gone(core: Any, timeout: float = 90.0, namespace: str = AGENT_NAMESPACE) -> None:
    kubepods.wait_for(lambda: not agent_pods(core, namespace), "the agent pods to be gone", timeout)


@dataclass(frozen=True)
class Agent:
    pod: kubepods.PodView
    namespace: str = AGENT_NAMESPACE

    def logs(self, core: Any) -> str:
        return kubepods.logs(core, self.namespace, self.pod.name, AGENT_CONTAINER)


def ready_agent(
    core: Any,
    cluster: RealCluster,
    timeout: float = READY_TIMEOUT,
    image: Image | None = None,
    namespace: str = AGENT_NAMESPACE,
) -> Agent:
    """The agent pod on the node, once Running and Ready (and of `image`, when given)."""
    view = ready_daemon_pod(
        core,
        cluster,
        namespace=namespace,
        selector=AGENT_SELECTOR,
        container=AGENT_CONTAINER,
        what="the agent pod",
        image=image,
        timeout=timeout,
    )
    return Agent(view, namespace)


def ready_daemon_pod(
    core: Any,
    cluster: RealCluster,
    *,
    namespace: str,
    selector: str,
    container: str,
    what: str,
    image: Image | None = None,
    timeout: float = READY_TIMEOUT,
) -> kubepods.PodView:
    """A DaemonSet's pod on the node (`selector` in `namespace`), once Running and Ready (and of
    `image`, when given). On timeout: each pod's state, events, the warnings and errors of
    `container`'s log and its end."""

    def pods() -> list[Any]:
        return list(core.list_namespaced_pod(namespace, label_selector=selector).items)

    def check() -> kubepods.PodView | None:
        for pod in pods():
            view = kubepods.PodView.of(pod)
            if pod.metadata.deletion_timestamp or view.node != cluster.node_name:
                continue
            if image is not None and pod.spec.containers[0].image != image.ref:
                continue
            if view.phase == "Running" and view.ready:
                return view
        return None

    def state() -> str:
        cluster.check_alive()
        lines = []
        for pod in pods():
            view = kubepods.PodView.of(pod)
            log = kubepods.logs(core, namespace, view.name, container)
            noted = [s for s in log.splitlines() if any(w in s for w in NOTED_LEVELS)]
            lines += [
                f"{view}",
                kubepods.pod_events(core, namespace, view.name),
                "its log's warnings and errors:",
                *noted[:40],
                "its log's end:",
                log[-3000:],
            ]
        return "\n".join(lines) or f"no pod {selector} in {namespace}"

    view: kubepods.PodView = kubepods.wait_for(
        check, f"{what} Running and Ready", timeout, interval=0.5, on_timeout=state
    )
    return view


def install(helm: Helm, cluster: RealCluster, core: Any, image: Image, **values: Any) -> Agent:
    """`helm install` with the node's values (+ `values`), then the agent Ready on the node."""
    helm.install(
        RELEASE, CHART, namespace=AGENT_NAMESPACE, values=node_values(cluster, image, **values)
    )
    return ready_agent(core, cluster, image=image)


def uninstall(helm: Helm, core: Any) -> None:
    """`helm uninstall` of the release install() made, then its agent pods gone."""
    helm.uninstall(RELEASE, namespace=AGENT_NAMESPACE)
    wait_agent_gone(core)


def conflist(cluster: RealCluster) -> dict[str, Any]:
    return dict(json.loads(cluster.conflist_path.read_text()))


def plugin_types(cluster: RealCluster) -> list[str]:
    return [p.get("type") for p in conflist(cluster)["plugins"]]


def wait_conflist(
    cluster: RealCluster,
    condition: Callable[[dict[str, Any]], bool],
    what: str = "the conflist",
    timeout: float = 30.0,
) -> None:
    def check() -> bool:
        try:
            return condition(conflist(cluster))
        except (OSError, ValueError):  # between the agent's write and rename
            return False

    kubepods.wait_for(
        check, what, timeout, on_timeout=lambda: cluster.conflist_path.read_text(errors="replace")
    )


_exec_ids = itertools.count()


def agent_status(cluster: RealCluster, agent: Agent, *argv: str) -> tuple[int, str]:
    """`istio-cni-agent status ARGV` run in the agent's container by the runtime (where `kubectl
    exec` ends): (exit code, stdout and stderr)."""
    runtime = cluster.cri  # containerd 1.6 or 2: ctr reaches into containers
    assert isinstance(runtime, Containerd), f"no ctr exec on {type(runtime).__name__}"
    container, _ = runtime.running_container(agent.pod.uid, AGENT_CONTAINER)
    done = runtime.ctr(
        "tasks", "exec", "--exec-id", f"status-{os.getpid()}-{next(_exec_ids)}", container,
        "istio-cni-agent", "status", *argv, check=False, timeout=60,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr
