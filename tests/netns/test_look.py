"""The cheap look into a pod's netns (agent.netns.look) against what the tools report, and the
apply that trusts it: rules written after the look equal rules written after reading state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.netns.look import Family, look
from agent.rules import backend_restore
from agent.rules.sidecar import apply
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.pod import capture_config_for_pod
from testbed import netns

pytestmark = pytest.mark.netns

POD = {
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "app", "annotations": {"sidecar.istio.io/status": "{}"}},
    "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]},
}


def run_in(name: str, *argv: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", name, *argv], check=True, capture_output=True, text=True
    ).stdout


def test_a_fresh_sandbox_holds_no_table(pod_netns: Path) -> None:
    seen = look(str(pod_netns))
    assert seen.legacy_tables == {4: frozenset(), 6: frozenset()}
    assert seen.nft_tables == frozenset()
    assert seen.legacy_loaded is False
    assert seen.ipv6_addresses == ("::1",)


def test_tables_and_addresses_as_the_tools_see_them(pod_netns: Path) -> None:
    run_in(pod_netns.name, "iptables-nft", "-t", "nat", "-N", "OTHER")
    run_in(pod_netns.name, "ip6tables-legacy", "-t", "mangle", "-N", "OTHER")
    run_in(pod_netns.name, "nft", "add", "table", "inet", "someone-else")
    netns.ip("addr", "add", "2001:db8::7/64", "dev", "lo", netns=pod_netns.name)

    seen = look(str(pod_netns))

    assert seen.nft_tables is not None and (4, "nat") in seen.nft_tables
    assert (6, "mangle") not in seen.nft_tables  # legacy tables are not nf_tables ones
    assert seen.legacy_tables == {4: frozenset(), 6: frozenset({"mangle"})}
    assert seen.legacy_loaded is True
    assert "2001:db8::7" in seen.ipv6_addresses
    assert seen.tables_absent("nft", 6, ("nat", "mangle"))
    assert not seen.tables_absent("nft", 4, ("nat",))
    assert not seen.tables_absent("legacy", 6, ("mangle",))
    assert apply.host_facts(str(pod_netns), seen=seen)[0] is True


@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_apply_after_a_look_writes_what_the_full_read_writes(variant: str, pod_netns: Path) -> None:
    other = netns.unique_name("it-look")
    netns.add(other)
    try:
        ruleset = build(capture_config_for_pod(POD, ipv6=False, dns_servers=[]))
        empty: frozenset[Family] = frozenset({4, 6})  # the look's word on a fresh sandbox
        backend_restore.apply(str(pod_netns), ruleset, variant, empty=empty)
        backend_restore.apply(f"/run/netns/{other}", ruleset, variant)
        save = f"iptables-{variant}-save"
        assert strip_comments(run_in(pod_netns.name, save)) == strip_comments(run_in(other, save))
        assert backend_restore.present(str(pod_netns), ruleset, variant)
    finally:
        netns.delete(other)


def strip_comments(saved: str) -> list[str]:
    return [line for line in saved.splitlines() if not line.startswith("#")]
