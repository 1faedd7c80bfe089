"""CHECK and DEL through cnitool, per the CNI spec: CHECK after ADD passes and fails once the
pod's rules are gone; DEL succeeds and succeeds again (idempotent)."""

from __future__ import annotations

import subprocess

import pytest

from testbed.cni import Sandbox
from tests.integration.conftest import MeshNode, rules_in

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.chart]


def remove_jump_by_hand(sandbox: Sandbox) -> None:
    """What an operator might do: take the OUTPUT jump into our chain out, with the iptables
    variant that holds it (a -save without -t loads no table)."""
    for variant in ("legacy", "nft"):
        saved = subprocess.run(
            ["ip", "netns", "exec", sandbox.netns_name, f"iptables-{variant}-save"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        if "-A OUTPUT -j ISTIO_OUTPUT" in saved:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    sandbox.netns_name,
                    f"iptables-{variant}",
                    "-t",
                    "nat",
                    "-D",
                    "OUTPUT",
                    "-j",
                    "ISTIO_OUTPUT",
                ],
                check=True,
                capture_output=True,
            )
            return
    raise AssertionError(f"no jump into ISTIO_OUTPUT in {sandbox.netns_name}:\n{rules_in(sandbox)}")


def test_check_passes_after_add_and_fails_when_rules_were_removed(mesh_node: MeshNode) -> None:
    sandbox = mesh_node.sandbox(mesh_node.pod("default"))
    mesh_node.cni.add(sandbox)

    check = mesh_node.cnitool("CHECK", sandbox)
    assert check.ok, check.stderr

    remove_jump_by_hand(sandbox)
    check = mesh_node.cnitool("CHECK", sandbox)
    assert not check.ok
    assert "redirect rules missing" in check.stderr


def test_del_is_idempotent(mesh_node: MeshNode) -> None:
    sandbox = mesh_node.sandbox(mesh_node.pod("default"))
    mesh_node.cni.add(sandbox)

    first = mesh_node.cnitool("DEL", sandbox)
    second = mesh_node.cnitool("DEL", sandbox)

    assert first.ok, first.stderr
    assert second.ok, second.stderr
    # After DEL the runtime holds no result for the sandbox: CHECK has nothing to check.
    assert not mesh_node.cnitool("CHECK", sandbox).ok


def test_del_of_a_sandbox_whose_netns_is_gone_succeeds(mesh_node: MeshNode) -> None:
    sandbox = mesh_node.sandbox(mesh_node.pod("default"))
    mesh_node.cni.add(sandbox)
    assert "ISTIO_OUTPUT" in rules_in(sandbox)
    mesh_node.cni.remove_sandbox(sandbox)

    assert mesh_node.cnitool("DEL", sandbox).ok
