"""Node layouts of the platforms the chart has presets for (values-examples/<name>.yaml): where
the runtime's CNI bin and conf dirs are, which primary CNI config sits there (the provider's own
file from tests/testdata/istio-conformance/real-world, with the node's pod subnet put in), and
which of its plugins are real (Debian's reference plugins) or test doubles (testbed/cni_double.py).

RealCluster.relayout(platform) builds one on the real node: the platform's paths exist only in
the node's mount namespace (testbed/mountns.py), as binds of dirs under `<node>/platform/`.
OpenShift's runs CRI-O instead of containerd (testbed/crio.py), and Multus's thin plugin (built
from its source) as the CNI the runtime calls; RUNTIME_VARIANTS lay a preset's platform out on
another runtime it runs (CRI-O, containerd 2: testbed/containerd2.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.crio import PINNED_DIRS
from testbed.parts import Part, cni_plugin_1_1, multus

REAL_WORLD = Path(__file__).resolve().parent.parent / "tests/testdata/istio-conformance/real-world"

# Node paths every layout gets from the node's dir: host-local's and libcni's state
# (/var/lib/cni), containerd's pod netns dir, and the agent's run dir (the chart's default).
SCRATCH_DIRS = ("/var/lib/cni", "/var/run/netns", "/var/run/istio-cni")

Edit = Callable[[dict[str, Any], str], None]
"""Puts the node's pod subnet into the provider's conflist (in place)."""


@dataclass(frozen=True)
class Double:
    plugin_type: str
    mode: str
    """cni_double modes: delegate, flannel, pass."""


@dataclass(frozen=True)
class Platform:
    name: str
    """The preset's name (values-examples/<name>.yaml, --set platform=<name>)."""
    bin_dir: str
    conf_dir: str
    conflist_name: str
    conflist_source: str
    """File in REAL_WORLD."""
    edit: Edit | None = None
    doubles: tuple[Double, ...] = ()
    extra_dirs: tuple[str, ...] = ()
    """More node paths given a dir of their own (a primary plugin's state)."""
    bin_overlay: bool = False
    """The bin dir is a system dir (k3d: /bin): an overlay keeps the machine's files."""
    flannel_subnet_env: bool = False
    """flanneld's /run/flannel/subnet.env for the flannel plugin."""
    runtime_note: str = ""
    runtime_values: tuple[tuple[str, str], ...] = ()
    """Chart values the runtime run here needs beyond the preset (see `runtime_note`)."""
    real: tuple[str, ...] = field(default=())
    """The primary's plugins that are the real ones (Debian's)."""
    built: tuple[Part, ...] = ()
    """Plugins of the primary the test bed builds from their source (real ones: Multus)."""
    runtime: str = "containerd"
    """The node's container runtime: containerd (Debian's 1.6), containerd2 (testbed/
    containerd2.py) or crio (testbed/crio.py)."""
    kubeconfig: str = ""
    """A node path where the primary expects a kubeconfig (Multus's), written by the layout."""
    delegate_conf_dir: str = ""
    """Multus's confDir: where a NetworkAttachmentDefinition without spec.config is looked up
    (the chart's standalone config goes there)."""

    def conflist(self, subnet: str) -> str:
        """The provider's file, bytes as the provider writes them unless the pod subnet had to
        go in (then re-serialised with the same key order)."""
        text = (REAL_WORLD / self.conflist_source).read_text()
        if self.edit is None:
            return text
        config = json.loads(text)
        self.edit(config, subnet)
        return json.dumps(config, indent=2) + "\n"

    def node_paths(self) -> tuple[str, ...]:
        """Every node path the layout binds (the bin dir only when not an overlay)."""
        own = (self.conf_dir, *SCRATCH_DIRS, *self.extra_dirs)
        if self.flannel_subnet_env:
            own += ("/run/flannel",)
        return own if self.bin_overlay else (self.bin_dir, *own)


def _ranges_subnet(config: dict[str, Any], subnet: str) -> None:
    config["plugins"][0]["ipam"]["ranges"] = [[{"subnet": subnet}]]


def _bridge_subnet(config: dict[str, Any], subnet: str) -> None:
    config["plugins"][0]["ipam"]["subnet"] = subnet


def _openshift_multus(config: dict[str, Any], subnet: str) -> None:
    """Multus's thin config as OpenShift's network operator sets it (namespace isolation with
    `default` global, binaries and kubeconfig where OpenShift keeps them), its default network
    CRI-O's own bridge config on the node's subnet (OVN-Kubernetes cannot run here)."""
    default = json.loads((REAL_WORLD / "crio-bridge.conf").read_text())
    default["ipam"]["ranges"] = [[{"subnet": subnet}]]
    default["ipam"]["routes"] = [{"dst": "0.0.0.0/0"}]
    config.pop("cniConf", None)  # the thin entrypoint's container path; Multus's default applies
    config.update(
        {
            "namespaceIsolation": True,
            "globalNamespaces": "default,openshift-multus,openshift-sriov-network-operator",
            "logLevel": "verbose",
            "binDir": "/var/lib/cni/bin",
            "kubeconfig": OPENSHIFT_MULTUS_KUBECONFIG,
            "delegates": [default],
        }
    )


OPENSHIFT_MULTUS_KUBECONFIG = "/etc/kubernetes/cni/net.d/multus.d/multus.kubeconfig"
CALICO = Double("calico", "delegate")

PLATFORMS: dict[str, Platform] = {
    p.name: p
    for p in (
        Platform(
            "gke",
            "/home/kubernetes/bin",
            "/etc/cni/net.d",
            "10-gke-ptp.conflist",
            "gke-ptp.conflist",
            edit=_ranges_subnet,
            real=("ptp", "host-local", "portmap"),
            runtime="containerd2",
            runtime_note="containerd 2 (GKE's node images since 1.33)",
        ),
        Platform(
            "eks",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "10-aws.conflist",
            "aws-vpc-cni.conflist",
            doubles=(Double("aws-cni", "delegate"), Double("egress-cni", "pass")),
            real=("portmap",),
            runtime="containerd2",
            runtime_note="containerd 2 (EKS's AL2023 node images since 1.33)",
        ),
        Platform(
            "aks",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "10-azure.conflist",
            "azure.conflist",
            doubles=(Double("azure-vnet", "delegate"),),
            real=("portmap",),
        ),
        Platform(
            "iks",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "10-calico.conflist",
            "calico.conflist",
            doubles=(CALICO,),
            real=("portmap", "bandwidth"),
        ),
        Platform(
            "k3s",
            "/var/lib/rancher/k3s/data/cni",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "10-flannel.conflist",
            "k3s-flannel.conflist",
            doubles=(Double("flannel", "flannel"),),
            flannel_subnet_env=True,
            real=("bridge", "host-local", "portmap", "bandwidth"),
        ),
        Platform(
            "k3d",
            "/bin",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "10-flannel.conflist",
            "k3s-flannel.conflist",
            doubles=(Double("flannel", "flannel"),),
            bin_overlay=True,
            flannel_subnet_env=True,
            real=("bridge", "host-local", "portmap", "bandwidth"),
        ),
        Platform(
            "microk8s",
            "/var/snap/microk8s/current/opt/cni/bin",
            "/var/snap/microk8s/current/args/cni-network",
            "10-calico.conflist",
            "microk8s-calico.conflist",
            doubles=(CALICO,),
            real=("portmap", "bandwidth"),
        ),
        Platform(
            "minikube",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "1-k8s.conflist",
            "minikube-bridge.conflist",
            edit=_bridge_subnet,
            real=("bridge", "host-local", "portmap", "firewall"),
            runtime_note=(
                "containerd (minikube --container-runtime=containerd); the Docker runtime the "
                "preset is for (netns in /var/run/docker/netns) cannot run here"
            ),
            runtime_values=(("cniNetnsDir", "/var/run/netns"),),
            extra_dirs=("/var/run/docker/netns",),  # the Docker runtime's, empty here
        ),
        Platform(
            "kind",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "10-kindnet.conflist",
            "kindnet.conflist",
            edit=_ranges_subnet,
            extra_dirs=("/run/cni-ipam-state",),
            real=("ptp", "host-local", "portmap"),
        ),
        Platform(
            "openshift",
            "/var/lib/cni/bin",
            "/etc/kubernetes/cni/net.d",
            "00-multus.conf",
            "multus-thin.conf",
            edit=_openshift_multus,
            built=(multus(),),
            # Multus's confDir (our standalone config) and CRI-O's pinned namespaces' dirs.
            extra_dirs=(
                "/etc/cni/multus/net.d",
                *PINNED_DIRS,
            ),
            delegate_conf_dir="/etc/cni/multus/net.d",
            real=("multus", "bridge", "host-local"),
            runtime="crio",
            runtime_note="CRI-O with conmon and runc, kubelet on it (as OpenShift's nodes)",
            kubeconfig=OPENSHIFT_MULTUS_KUBECONFIG,
        ),
        Platform(
            "rke2",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "10-canal.conflist",
            "canal.conflist",
            doubles=(CALICO,),
            real=("portmap", "bandwidth"),
        ),
    )
}

RUNTIME_VARIANTS: dict[str, Platform] = {
    # kind's node image runs containerd 2 (since kind v0.27): the same layout, containerd 2
    # (testbed/containerd2.py) reading kindnet's conflist, pod netns in /var/run/netns.
    "kind-on-containerd2": replace(
        PLATFORMS["kind"],
        runtime="containerd2",
        runtime_note="containerd 2 (kind's node image since v0.27)",
    ),
    # minikube also runs CRI-O (--container-runtime=cri-o): the same layout, CRI-O reading the
    # chained conflist (and reloading it when the agent writes our entry in).
    "minikube-on-crio": replace(
        PLATFORMS["minikube"],
        runtime="crio",
        runtime_note="CRI-O (minikube --container-runtime=cri-o)",
        extra_dirs=(*PLATFORMS["minikube"].extra_dirs, *PINNED_DIRS),
    ),
}
"""Layouts of a preset's platform on another runtime it supports, by test id."""


def _kind_cni_1_1(config: dict[str, Any], subnet: str) -> None:
    _ranges_subnet(config, subnet)
    config["cniVersion"] = "1.1.0"


KIND_CNI_1_1 = replace(
    RUNTIME_VARIANTS["kind-on-containerd2"],
    edit=_kind_cni_1_1,
    built=(cni_plugin_1_1("ptp"), cni_plugin_1_1("host-local"), cni_plugin_1_1("portmap")),
    runtime_note="containerd 2 loading kindnet's conflist at cniVersion 1.1.0",
)
"""kind on containerd 2 with kindnet's conflist at cniVersion 1.1.0 and plugins that speak it
(ci/go/cni-plugins, in place of Debian's): containerd's CRI Status calls the CNI STATUS verb of
each plugin of the conflist it loaded, ours when chained, and kubelet turns a failed STATUS into
the node's NetworkReady false."""

CILIUM = Platform(
    "cilium",
    "/opt/cni/bin",
    "/etc/cni/net.d",
    "05-cilium.conflist",
    "cilium.conflist",
    doubles=(Double("cilium-cni", "delegate"),),
)
"""A node whose primary is Cilium (no preset: the chart's defaults fit it), for the fight with an
agent that rewrites its conflist (cni.exclusive=true)."""
