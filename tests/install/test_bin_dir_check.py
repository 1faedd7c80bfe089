"""The cni-bin-dir readiness check on real dirs: cniBinDir holding none of the primary's plugins
is named, with the node paths and the preset; any one of them there, or nothing to tell by,
passes."""

from __future__ import annotations

import json

import pytest

from agent.install.installer import Installer
from testbed.agent_host import Node

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}


def _installer(node: Node, **settings: object) -> Installer:
    node.with_settings(**settings)
    return Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")


def _primary(node: Node, config: object = LIST, name: str = "10-net.conflist") -> None:
    (node.conf_dir / name).write_text(json.dumps(config))


@pytest.mark.parametrize("platform", ["gke", ""])
def test_bin_dir_without_the_primarys_plugins_is_named(node: Node, platform: str) -> None:
    _primary(node)
    installer = _installer(
        node, platform=platform, cniBinDir="/home/kubernetes/bin", cniConfDir="/etc/cni/net.d"
    )
    installer.install()  # chained all the same: pods fail closed rather than start uncaptured
    problem = installer.bin_dir_problem()
    assert problem is not None
    assert "cniBinDir /home/kubernetes/bin holds none of the plugins" in problem
    assert "/etc/cni/net.d/10-net.conflist names (portmap, ptp)" in problem
    preset = "platform preset 'gke'" if platform else "no platform preset set"
    assert preset in problem, problem


def test_one_of_the_primarys_plugins_is_enough(node: Node) -> None:
    _primary(node)
    (node.bin_dir / "portmap").write_bytes(b"")
    installer = _installer(node)
    installer.install()
    assert installer.bin_dir_problem() is None


def test_a_link_the_agent_cannot_resolve_counts(node: Node) -> None:
    _primary(node)
    (node.bin_dir / "ptp").symlink_to("/var/lib/rancher/k3s/data/current/bin/cni")
    installer = _installer(node)
    installer.install()
    assert installer.bin_dir_problem() is None


def test_a_single_conf_counts_and_our_own_entry_does_not(node: Node) -> None:
    _primary(node, {"cniVersion": "0.3.1", "name": "net", "type": "bridge"}, "10-net.conf")
    installer = _installer(node)
    installer.install()  # the .conf becomes a list with our entry: istio-cni is in the bin dir
    assert (node.bin_dir / "istio-cni").exists()
    problem = installer.bin_dir_problem()
    assert problem is not None and "names (bridge)" in problem, problem


def test_nothing_to_tell_by_passes(node: Node) -> None:
    assert _installer(node).bin_dir_problem() is None  # no primary yet: the install check waits
    _primary(node)
    assert _installer(node, chained=False).bin_dir_problem() is None  # standalone
