"""The steps of the live demo on a real node (ci/demo.py runs them in order, then
`Demo.cleanup()`).

The node is the test bed's real single-node cluster: a control plane, kube-scheduler, and kubelet
with containerd in a network namespace of its own. The chart's DaemonSet runs the agent image
built from the Dockerfile; pods are created through the API and started by kubelet through the
runtime's CNI chain. Each step prints, in a few plain lines, what it did and what it saw. A step
that finds something wrong raises StepError saying what; the runner names the step.
"""

from __future__ import annotations

import functools
import json
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client as k8s

from testbed import kubepods, podnet
from testbed.chart import (
    AGENT_CONTAINER,
    AGENT_NAMESPACE,
    RELEASE,
    Agent,
    agent_pods,
    conflist,
    install,
    wait_agent_gone,
)
from testbed.helm import Helm
from testbed.parts import helm_binaries
from testbed.realnode import RealCluster

APP_NAMESPACE = "demo"
# TEST-NET-3 (RFC 5737): an address no network routes. With the sidecar's rules the connection
# stays inside the pod; without them it ends in the node's network namespace, which has no route.
OUTSIDE = ("203.0.113.10", 80)
APP_PORT = 8080
WIDTH = 100


class StepError(Exception):
    """A step found something wrong; the message says what."""


class Console:
    """Short lines for the reader on `out`; the same plus details in demo.log."""

    def __init__(self, out: TextIO, log_path: Path) -> None:
        self.out = out
        self._log = log_path.open("a")

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()
        self.log(text)

    def say(self, text: str) -> None:
        """A sentence, wrapped to WIDTH under the step's title."""
        for row in textwrap.wrap(
            text, WIDTH, initial_indent="    ", subsequent_indent="      ", break_on_hyphens=False
        ):
            self.line(row)

    def block(self, text: str) -> None:
        """Verbatim lines (tables, rules, JSON), indented."""
        for row in text.splitlines():
            self.line(f"        {row}")

    def log(self, text: str) -> None:
        if not self._log.closed:
            self._log.write(text + "\n")
            self._log.flush()

    def close(self) -> None:
        self._log.close()


@dataclass
class Demo:
    """The demo's state; each step is a method, `cleanup()` undoes whatever was done."""

    workdir: Path
    console: Console
    cluster: RealCluster | None = None
    helm: Helm | None = None
    agent: Agent | None = None
    reference_conflist: str = ""
    pods: dict[str, kubepods.PodView] = field(default_factory=dict)

    # -- steps -------------------------------------------------------------------------------

    def start_node(self) -> None:
        self.cluster = RealCluster(self.workdir / "cluster")
        began = time.monotonic()
        self.cluster.start()
        core = self.cluster.core()
        version = k8s.VersionApi(core.api_client).get_code().git_version
        node = core.read_node(self.cluster.node_name)
        info = node.status.node_info
        say = self.console.say
        say(
            f"etcd, kube-apiserver {version}, kube-controller-manager and kube-scheduler; "
            f"API server {self.cluster.plane.server if self.cluster.plane else '?'}"
        )
        say(
            f"node {self.cluster.node_name}: kubelet {info.kubelet_version}, "
            f"{info.container_runtime_version} (runc), in network namespace "
            f"{self.cluster.network.netns_name} (address {self.cluster.network.node_ip}, no "
            f"route out); Ready {time.monotonic() - began:.1f} s after the start"
        )
        say(
            "images built here and imported into containerd: "
            + ", ".join(image.ref for image in self.cluster.images.values())
        )
        say(
            f"CNI: bin dir {self.cluster.cni_bin_dir} (Debian's reference plugins), conf dir "
            f"{self.cluster.cni_conf_dir}: {self._chain()}"
        )
        self.reference_conflist = self.cluster.conflist_path.read_text()

    def helm_install(self) -> None:
        cluster = self._cluster()
        binaries = helm_binaries()
        version = max(binaries, key=_version_key)
        self.helm = Helm(
            binary=binaries[version], kubeconfig=cluster.kubeconfig, home=self.workdir / "helm"
        )
        image = cluster.images["istio-cni"]
        began = time.monotonic()
        self.agent = install(self.helm, cluster, cluster.core(), image, logLevel="info")
        say = self.console.say
        say(
            f"helm {self.helm.reported_version()} install {RELEASE} charts/istio-cni "
            f"-n {AGENT_NAMESPACE} "
            f"--set hub={image.hub},tag={image.tag},cniBinDir=...,cniConfDir=..."
        )
        say(
            f"kubelet started the DaemonSet's pod; Ready (readiness probe passed) "
            f"{time.monotonic() - began:.1f} s after helm install. "
            f"kubectl get pods -n {AGENT_NAMESPACE} -o wide:"
        )
        self.console.block(self._pod_table(agent_pods(cluster.core())))

    def show_conflist(self) -> None:
        cluster = self._cluster()
        plugins = conflist(cluster)["plugins"]
        if plugins[-1].get("type") != "istio-cni":
            raise StepError(
                f"{cluster.conflist_path}: istio-cni is not chained last: {self._chain()}"
            )
        say = self.console.say
        say(f"{cluster.conflist_path.name}: {self._chain()} (our entry, chained last):")
        self.console.block(json.dumps(plugins[-1], indent=2))
        plugin = cluster.cni_bin_dir / "istio-cni"
        say(
            f"bin dir: istio-cni ({plugin.stat().st_size / 1e6:.1f} MB, one static executable) "
            "copied in by the agent from its image"
        )

    def start_pods(self) -> None:
        cluster = self._cluster()
        core = cluster.core()
        core.create_namespace({"metadata": {"name": APP_NAMESPACE}})
        kubepods.wait_for(
            lambda: _has_default_sa(core, APP_NAMESPACE),
            f"{APP_NAMESPACE}/default ServiceAccount",
            30,
        )
        image = cluster.images["workload"].ref
        loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "1"]
        for name, sidecar in (("app-with-sidecar", True), ("app-without-sidecar", False)):
            core.create_namespaced_pod(
                APP_NAMESPACE, kubepods.pod_manifest(name, image, app_command=loop, sidecar=sidecar)
            )
        for name in ("app-with-sidecar", "app-without-sidecar"):
            self.pods[name] = kubepods.wait_running(core, APP_NAMESPACE, name)
        self.console.say(
            "two pods created through the API (no nodeName): app-with-sidecar as Istio's "
            "injector leaves a pod (annotation sidecar.istio.io/status, an istio-proxy "
            "container: here a test double of Envoy listening on 15001 and 15006), and "
            f"app-without-sidecar. kubectl get pods -n {APP_NAMESPACE} -o wide:"
        )
        self.console.block(self._pod_table(core.list_namespaced_pod(APP_NAMESPACE).items))

    def show_rules(self) -> None:
        cluster = self._cluster()
        say = self.console.say
        sidecar = self.pods["app-with-sidecar"]
        netns = cluster.pod_netns(sidecar.uid)
        rules = _rules_only(podnet.saved_rules(netns))
        if "ISTIO_REDIRECT" not in rules:
            raise StepError(f"no redirect rules in {sidecar.name}'s netns:\n{rules}")
        say(
            f"iptables-save in {sidecar.name}'s network namespace ({netns}), programmed by the "
            "agent when kubelet's runtime ran the chain:"
        )
        self.console.block(rules)
        plain = self.pods["app-without-sidecar"]
        if podnet.has_istio_rules(cluster.pod_netns(plain.uid)):
            raise StepError(f"{plain.name} has rules of ours")
        say(
            f"{plain.name}: no istio-proxy container, so the agent left its namespace alone "
            "(no rules)"
        )

    def show_traffic(self) -> None:
        cluster = self._cluster()
        core = cluster.core()
        say = self.console.say
        target = f"{OUTSIDE[0]}:{OUTSIDE[1]}"
        sidecar, plain = self.pods["app-with-sidecar"], self.pods["app-without-sidecar"]
        say(
            f"each app connects to {target} once a second; the Envoy double answers with the "
            "port the connection arrived on and its original destination (SO_ORIGINAL_DST)"
        )
        line = kubepods.wait_log_line(
            core,
            APP_NAMESPACE,
            sidecar.name,
            "app",
            lambda s: "proxy-double port=15001" in s and target in s,
            "a connection answered by the proxy",
        )
        say(f"{sidecar.name} ({sidecar.ip}) -> {target}, from its log:")
        self.console.block(line.strip())
        line = kubepods.wait_log_line(
            core,
            APP_NAMESPACE,
            plain.name,
            "app",
            lambda s: f"connect {target}" in s,
            "a connection attempt",
        )
        if "proxy-double" in line or not kubepods.escaped(line):
            raise StepError(f"{plain.name}'s connection was not left alone: {line}")
        say(
            f"{plain.name} ({plain.ip}) -> {target}: not redirected; it left the pod and found "
            "no route in the node's network namespace:"
        )
        self.console.block(line.strip())
        reply = podnet.connect(cluster.network.netns_path, str(sidecar.ip), APP_PORT)
        if not reply.startswith("proxy-double port=15006"):
            raise StepError(f"inbound {sidecar.ip}:{APP_PORT} did not reach 15006: {reply}")
        say(f"inbound: the node -> {sidecar.ip}:{APP_PORT}: {reply}")

    def show_agent_log(self) -> None:
        cluster = self._cluster()
        assert self.agent is not None
        logs = self.agent.logs(cluster.core())
        lines = [
            _short_log(s)
            for s in logs.splitlines()
            if f"pod={APP_NAMESPACE}/" in s or "install ready" in s
        ]
        wanted = {"pod redirected": "app-with-sidecar", "pod skipped": "app-without-sidecar"}
        for what, pod in wanted.items():
            if not any(what in s and f"pod={APP_NAMESPACE}/{pod}" in s for s in lines):
                raise StepError(f"no '{what}' line for {pod} in the agent's log:\n{logs[-3000:]}")
        self.console.say(
            f"kubectl logs -n {AGENT_NAMESPACE} {self.agent.pod.name} -c "
            f"{AGENT_CONTAINER} (the API's pod log endpoint): the install, and the "
            "plugin's ADD for each pod as the agent answered it:"
        )
        self.console.block("\n".join(lines[:12]))

    def uninstall(self) -> None:
        cluster = self._cluster()
        assert self.helm is not None
        core = cluster.core()
        self._delete_pods()
        began = time.monotonic()
        self.helm.uninstall(RELEASE, namespace=AGENT_NAMESPACE)
        wait_agent_gone(core)
        say = self.console.say
        say(
            f"helm uninstall {RELEASE}: kubelet stopped the agent, which saw its DaemonSet go "
            f"and removed itself ({time.monotonic() - began:.1f} s)"
        )
        left = sorted(p.name for p in cluster.cni_bin_dir.glob("istio-cni*"))
        same = cluster.conflist_path.read_text() == self.reference_conflist
        say(
            f"{cluster.conflist_path.name}: {self._chain()}, "
            f"{'byte-identical to' if same else 'DIFFERENT from'} the one before the install; "
            f"bin dir: {', '.join(left) or 'no istio-cni files'}"
        )
        if left or not same:
            raise StepError("the agent did not remove its plugin and entry")

    # -- cleanup -----------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Undo everything, in reverse; keep going past failures and return them."""
        errors: list[str] = []

        def attempt(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as e:  # the rest must still be cleaned up
                errors.append(f"{what}: {e}")

        if self.cluster is not None and self.cluster.plane is not None and self.pods:
            attempt("pods", self._delete_pods)
        if self.helm is not None:
            for release, namespace in list(self.helm.releases):
                attempt(
                    f"helm uninstall {release}",
                    functools.partial(self.helm.uninstall, release, namespace=namespace),
                )
        if self.cluster is not None:
            attempt("the node and the control plane", self.cluster.stop)
        return errors

    # -- helpers -----------------------------------------------------------------------------

    def _cluster(self) -> RealCluster:
        assert self.cluster is not None
        return self.cluster

    def _helm(self) -> Helm:
        assert self.helm is not None
        return self.helm

    def _delete_pods(self) -> None:
        core = self._cluster().core()
        for name in list(self.pods):
            kubepods.delete_and_wait(core, APP_NAMESPACE, name)
            del self.pods[name]

    def _chain(self) -> str:
        plugins = conflist(self._cluster())["plugins"]
        return " -> ".join(p["type"] + (" (+ host-local)" if "ipam" in p else "") for p in plugins)

    def _pod_table(self, pods: list[Any]) -> str:
        rows = [("NAME", "READY", "STATUS", "RESTARTS", "IP", "NODE")]
        for pod in pods:
            statuses = pod.status.container_statuses or []
            ready = sum(1 for c in statuses if c.ready)
            rows.append(
                (
                    pod.metadata.name,
                    f"{ready}/{len(pod.spec.containers)}",
                    str(pod.status.phase),
                    str(sum(c.restart_count for c in statuses)),
                    str(pod.status.pod_ip),
                    str(pod.spec.node_name),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        )


def _has_default_sa(core: Any, namespace: str) -> bool:
    return any(
        sa.metadata.name == "default"
        for sa in core.list_namespaced_service_account(namespace).items
    )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)) or (0,)


def _rules_only(saved: str) -> str:
    """The save output without comments (timestamps, generator) and empty tables."""
    return "\n".join(
        line for line in saved.splitlines() if line.strip() and not line.startswith("#")
    ).strip()


def _short_log(line: str) -> str:
    """An agent log line without its time and logger fields."""
    return re.sub(r"^time=\S+ level=\S+ logger=\S+ ", "", line)
