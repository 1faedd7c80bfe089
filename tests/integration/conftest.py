"""The node every integration test runs on: the chart installed into the test bed's API server,
the agent started from the chart's rendered config.yaml as its DaemonSet would run it (it
installs the built plugin into the node's CNI bin dir and chains it into the conflist), and
cnitool driving bridge + host-local + portmap + istio-cni for pods created through the API.

Helpers here look into a pod's network namespace the way an operator would: the -save output of
both iptables variants and `nft list ruleset`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.cni import CniNode, CniResult, Sandbox
from testbed.daemon import DaemonAgent
from testbed.helm import Helm
from testbed.node import NodePods
from tests.e2e.harness import ChartOnNode, Installed

AGENT_NAMESPACE = "istio-cni-it"
# The chart's defaults plus one namespace of our own, to see the configured list reach the plugin.
EXCLUDED = ["istio-system", "kube-system", "no-mesh"]
SIDECAR_ANNOTATIONS = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}
SIDECAR_CONTAINERS = [
    {"name": "app", "image": "registry.invalid/app:1"},
    {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
]


def rules_in(sandbox: Sandbox) -> str:
    """Everything netfilter holds in the pod's netns: legacy and nft iptables, and nftables."""
    out = []
    for argv in (
        ["iptables-legacy-save"],
        ["ip6tables-legacy-save"],
        ["iptables-nft-save"],
        ["ip6tables-nft-save"],
        ["nft", "list", "ruleset"],
    ):
        done = subprocess.run(
            ["ip", "netns", "exec", sandbox.netns_name, *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{' '.join(argv)} in {sandbox.netns_name}: {done.stderr}"
        out.append(f"# {' '.join(argv)}\n{done.stdout}")
    return "\n".join(out)


def has_istio_rules(sandbox: Sandbox) -> bool:
    return "ISTIO" in rules_in(sandbox)


@dataclass
class MeshNode:
    """A node with the chart's agent running; makes pods and their sandboxes."""

    harness: ChartOnNode
    installed: Installed
    agent: DaemonAgent
    cni: CniNode
    pods: NodePods

    def pod(self, namespace: str, *, sidecar: bool = True, **options: Any) -> dict[str, Any]:
        """A pod bound to the node (a sidecar-injected one by default)."""
        if sidecar:
            options.setdefault("annotations", dict(SIDECAR_ANNOTATIONS))
            options.setdefault("containers", SIDECAR_CONTAINERS)
        name = f"{options.pop('prefix', 'app')}-{secrets.token_hex(3)}"
        return self.pods.create(namespace, name, **options)

    def sandbox(self, pod: dict[str, Any]) -> Sandbox:
        meta = pod["metadata"]
        return self.cni.new_sandbox(meta["name"], meta["namespace"], meta["uid"])

    def cnitool(self, command: str, sandbox: Sandbox) -> CniResult:
        return self.cni.run(command, sandbox, check=False)

    def plugin_entry(self) -> dict[str, Any]:
        plugins = json.loads(self.cni.conflist_path.read_text())["plugins"]
        entries = [p for p in plugins if p["type"] == "istio-cni"]
        assert len(entries) == 1, f"want one istio-cni entry in {self.cni.conflist_path}"
        return dict(entries[0])

    @property
    def plugin_binary(self) -> Path:
        return self.cni.bin_dir / "istio-cni"


@contextlib.contextmanager
def running_mesh_node(
    chart_on_node: ChartOnNode,
    helm: Helm,
    cni_node: CniNode,
    node_pods: NodePods,
    **values: Any,
) -> Iterator[MeshNode]:
    """helm install with plugin debug logs, our exclude list and `values`, then the agent."""
    installed = chart_on_node.install(
        helm,
        AGENT_NAMESPACE,
        values={"logLevel": "debug", "excludeNamespaces": EXCLUDED, **values},
    )
    agent = chart_on_node.start_agent(installed)
    agent.wait_ready()
    node = MeshNode(chart_on_node, installed, agent, cni_node, node_pods)
    try:
        yield node
    finally:
        if agent.proc.poll() is None:
            agent.stop()


@pytest.fixture
def mesh_node(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Path],
    cni_node: CniNode,
    node_pods: NodePods,
) -> Iterator[MeshNode]:
    """The chart installed with the newest Helm, the agent running."""
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    with running_mesh_node(chart_on_node, helm, cni_node, node_pods) as node:
        yield node
