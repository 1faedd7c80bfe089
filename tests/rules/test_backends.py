"""Backend choice, host facts and namespace entry against real namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.netns import run_command, run_in_netns
from agent.rules.backends import choose_backend
from agent.rules.sidecar.apply import apply_rules, host_facts, rules_present
from agent.rules.sidecar.capture import CaptureConfig
from tests.rules.podnet import PodNet, sh

pytestmark = pytest.mark.netns


def test_host_facts_sees_pod_ipv6_and_injected_resolv_conf(podnet: PodNet, tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search svc\nnameserver 10.96.0.10\nnameserver fd00::a # cluster\n")
    assert host_facts(podnet.pod_path, resolv_conf=str(resolv)) == (
        True,
        ["10.96.0.10", "fd00::a"],
    )
    sh("ip", "-n", podnet.pod, "-6", "addr", "flush", "dev", "eth0", "scope", "global")
    assert host_facts(podnet.pod_path, resolv_conf=str(resolv))[0] is False


def test_auto_picks_legacy_when_the_namespace_uses_it(podnet: PodNet) -> None:
    """As Istio's plugin, in the pod's namespace only (the node's tables play no part)."""
    assert choose_backend(podnet.pod_path, "auto") == "iptables-nft"
    done = run_command(podnet.pod_path, ["iptables-legacy", "-A", "INPUT", "-j", "ACCEPT"])
    assert done.returncode == 0, done.stderr
    assert choose_backend(podnet.pod_path, "auto") == "ipv4=iptables-legacy,ipv6=iptables-nft"
    config = CaptureConfig(inbound_ports_include="*", outbound_ip_ranges_include="*")
    assert apply_rules(podnet.pod_path, config) == "ipv4=iptables-legacy,ipv6=iptables-nft"
    assert rules_present(podnet.pod_path, config, backend="auto")
    legacy = run_command(podnet.pod_path, ["iptables-legacy-save"]).stdout
    assert ":ISTIO_OUTPUT" in legacy


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["iptables-legacy", "-t", "nat", "-L", "-n"], "ipv4=iptables-legacy,ipv6=iptables-nft"),
        (["ip6tables-legacy", "-t", "nat", "-L", "-n"], "ipv4=iptables-nft,ipv6=iptables-legacy"),
    ],
    ids=["empty-ipv4-nat", "empty-ipv6-nat"],
)
def test_an_empty_legacy_table_counts_per_family(
    podnet: PodNet, argv: list[str], expected: str
) -> None:
    """Listing a table creates it, empty (Istio's probe does the same): Istio then picks legacy
    for that family, and so does auto."""
    done = run_command(podnet.pod_path, argv)
    assert done.returncode == 0, done.stderr
    assert choose_backend(podnet.pod_path, "auto") == expected


def test_forced_backend_is_used_and_unknown_is_refused(podnet: PodNet) -> None:
    assert choose_backend(podnet.pod_path, "nftables") == "nftables"
    with pytest.raises(RedirectError, match="unknown rule backend"):
        choose_backend(podnet.pod_path, "iptables")


def test_missing_namespace_is_a_clear_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "gone")
    with pytest.raises(RedirectError, match="gone"):
        run_in_netns(missing, lambda: None)
    with pytest.raises(RedirectError, match="gone"):
        apply_rules(missing, CaptureConfig(), backend="iptables-nft")


def test_entering_does_not_move_the_caller(podnet: PodNet) -> None:
    before = Path("/proc/thread-self/ns/net").resolve()
    inside = run_in_netns(podnet.pod_path, lambda: str(Path("/proc/thread-self/ns/net").resolve()))
    assert inside != str(before)
    assert Path("/proc/thread-self/ns/net").resolve() == before
