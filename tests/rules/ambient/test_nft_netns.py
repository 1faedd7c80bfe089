"""Ambient's `nftables` backend programs exactly Istio's native nftables rules, for real.

For each of Istio's ambient nftables goldens (ambient-nft/): Istio's commands fed to `nft -f` in
a blank network namespace, and our backend applying the same settings in another; `nft list
ruleset` must be equal (counters aside). Then the read-back sees them, a second apply leaves one
copy, and removal leaves the namespace empty. On the node side: the nft sets of enrolled pod IPs
(with pod UIDs), and real probes from kubelet's UID SNATed to Istio's probe address.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules.ambient import nft_apply as ambient_nft_apply
from agent.rules.ambient.apply import HostProbeRules, InpodRules
from agent.rules.ambient.builder import PROBE_IPSET_V4
from agent.rules.ambient.ipset import AddressSets
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.backend_nft import COUNTERS, expected_listing
from tests.rules.ambient.test_apply_netns import (
    PROBE_V4,
    PROBE_V6,
    check_entries_carry_the_pod_uid,
    landed,
    serve,
)
from tests.rules.ambient.test_nft import CASES
from tests.rules.podnet import PodNet, sh

pytestmark = pytest.mark.netns

POD_CASES = [c for c in CASES if json.loads((c / "case.json").read_text())["target"] == "pod"]
HOST_CASES = [c for c in CASES if json.loads((c / "case.json").read_text())["target"] == "host"]
KUBELET_UID = 4242  # the probing client runs as this UID; root is "other node traffic"

# What Istio's host set manager (cni/pkg/nftables/host_sets.go) runs before the host rules, as
# knftables writes it: the golden holds only the rules that name these sets.
ISTIO_HOST_SETS = """\
add table inet istio-ambient-nat
add set inet istio-ambient-nat istio-inpod-probes-v4 { type ipv4_addr ; comment "UUID of the pods that are part of ambient mesh" ; }
"""  # noqa: E501
ISTIO_HOST_SET_V6 = (
    "add set inet istio-ambient-nat istio-inpod-probes-v6 { type ipv6_addr ; "
    'comment "UUID of the pods that are part of ambient mesh" ; }\n'
)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"icni-anft-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")  # the in-pod routes need it
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def ruleset(path: str) -> str:
    return COUNTERS.sub("counter", run_command(path, ["nft", "list", "ruleset"]).stdout)


def options_of(case: dict) -> PodRuleOptions:  # type: ignore[type-arg]
    return PodRuleOptions(
        ipv6=case["ipv6"],
        redirect_dns=case["redirectDNS"],
        ingress=case["ingress"],
        virtual_interfaces=tuple(case["virtualInterfaces"]),
        dns_proxy=case["dnsProxy"],
        probe_snat=case["probeSNAT"],
        probe_snat_v6=case["probeSNATv6"],
    )


@pytest.mark.parametrize("case", POD_CASES, ids=lambda p: p.name)
def test_inpod_rules_list_as_istios_golden(netns: str, case: Path) -> None:
    want = expected_listing((case / "golden.txt").read_text())
    assert "table inet istio-ambient-nat" in want
    options = options_of(json.loads((case / "case.json").read_text()))
    rules = InpodRules(backend="nftables")
    assert rules.apply(netns, options) == "nftables"
    assert ruleset(netns) == want
    assert rules.present(netns, options)
    rules.apply(netns, options)  # again: replaced, not doubled
    assert ruleset(netns) == want
    rules.remove(netns)
    assert ruleset(netns) == ""
    assert not rules.present(netns, options)
    assert run_command(netns, ["ip", "route", "show", "table", "100"]).stdout == ""


def test_present_sees_a_changed_rule_and_others_tables_stay(netns: str) -> None:
    foreign = "table inet other {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\t}\n}\n"
    assert run_command(netns, ["nft", "-f", "-"], foreign).returncode == 0
    # A table an older agent wrote for ambient (ip family) goes on the next apply.
    stale = "table ip istio-proxy-nat {\n\tchain c {\n\t}\n}\n"
    assert run_command(netns, ["nft", "-f", "-"], stale).returncode == 0
    options = PodRuleOptions(ipv6=True)
    rules = InpodRules(backend="nftables")
    rules.apply(netns, options)
    assert "ip istio-proxy-nat" not in ruleset(netns)
    assert not rules.present(netns, PodRuleOptions(ipv6=True, ingress=True))
    flush = ["nft", "flush", "chain", "inet", "istio-ambient-mangle", "istio-output"]
    assert run_command(netns, flush).returncode == 0
    assert not rules.present(netns, options)
    rules.apply(netns, options)  # reconcile puts the whole set back
    assert rules.present(netns, options)
    rules.remove(netns)
    assert ruleset(netns) == foreign.replace("priority 0;", "priority filter; policy accept;")


@pytest.mark.parametrize("case", HOST_CASES, ids=lambda p: p.name)
def test_host_rules_list_as_istios_golden(netns: str, case: Path) -> None:
    c = json.loads((case / "case.json").read_text())
    istio = ISTIO_HOST_SETS + (ISTIO_HOST_SET_V6 if c["ipv6"] else "")
    want = expected_listing(istio + (case / "golden.txt").read_text())
    rules = HostProbeRules(
        netns,
        ipv6=c["ipv6"],
        probe_snat=c["probeSNAT"],
        probe_snat_v6=c["probeSNATv6"],
        backend="nftables",
        kubelet_uid=c["kubeletUID"],
    )
    rules.ensure()
    rules.ensure()  # again: one copy
    assert ruleset(netns) == want
    assert rules.present()
    rules.add("uid-a", ["10.9.0.1"])
    assert rules.present()  # the set's elements are no rules
    flush = ["nft", "flush", "chain", "inet", "istio-ambient-nat", "postrouting"]
    assert run_command(netns, flush).returncode == 0
    assert not rules.present()
    rules.ensure()  # restart: the rules are back and the sets keep their pods
    assert rules.present() and rules.entries() == {"10.9.0.1": "uid-a"}
    rules.remove_all()
    assert ruleset(netns) == ""
    rules.remove_all()  # nothing left to remove is fine


@pytest.fixture
def node(podnet: PodNet) -> Iterator[HostProbeRules]:
    """The peer namespace plays the node; the pod routes everything back through it."""
    sh("ip", "-n", podnet.pod, "route", "add", "default", "via", podnet.peer_ip)
    sh("ip", "-n", podnet.pod, "-6", "route", "add", "default", "via", podnet.peer_ip6)
    rules = HostProbeRules(
        podnet.peer_path,
        ipv6=True,
        probe_snat=PROBE_V4,
        probe_snat_v6=PROBE_V6,
        backend="nftables",
        kubelet_uid=str(KUBELET_UID),
    )
    try:
        yield rules
    finally:
        rules.remove_all()


def test_set_entries_carry_the_pod_uid(podnet: PodNet, node: HostProbeRules) -> None:
    check_entries_carry_the_pod_uid(podnet, node)
    listed = run_command(podnet.peer_path, ["nft", "list", "ruleset"]).stdout
    assert '10.99.0.1 comment "uid-c"' in listed  # nft sets, not ipsets
    with pytest.raises(RedirectError, match="No such file"):
        AddressSets(podnet.peer_path, v4=PROBE_IPSET_V4, v6=None).entries()  # no ipset made
    node.ensure()  # start-up again: entries are kept
    assert len(node.entries()) == 3
    node.sync([])
    assert node.entries() == {}


def probe(net: PodNet, host: str, *, uid: int | None) -> tuple[str, str, str]:
    """Connect from the node (peer) as `uid`: kubelet's, or root's for other node traffic."""
    answer = net.call(net.peer_path, "tcp", host, 8080, uid=uid)
    parts = answer.split("|")
    assert len(parts) == 3, answer
    return parts[0], parts[1], parts[2]


def test_kubelets_probes_to_enrolled_pods_are_snated(podnet: PodNet, node: HostProbeRules) -> None:
    pod, peer = podnet.pod_path, podnet.peer_path
    other_ip = podnet.pod_ip.rsplit(".", 1)[0] + ".3"  # a second pod IP, never enrolled
    sh("ip", "-n", podnet.pod, "addr", "add", f"{other_ip}/24", "dev", "eth0")
    serve(podnet, pod, ["tcp:8080:app", "tcp:15006:inbound"])
    node.ensure()
    node.add("uid-1", [podnet.pod_ip, podnet.pod_ip6])
    assert probe(podnet, podnet.pod_ip, uid=KUBELET_UID) == ("app", "8080", PROBE_V4)
    assert probe(podnet, podnet.pod_ip6, uid=KUBELET_UID) == ("app", "8080", PROBE_V6)
    # Not kubelet's UID (nftables matches the socket's owner), or not an enrolled pod: no SNAT.
    assert probe(podnet, podnet.pod_ip, uid=None) == ("app", "8080", podnet.peer_ip)
    assert probe(podnet, other_ip, uid=KUBELET_UID) == ("app", "8080", podnet.peer_ip)

    # With the pod's own rules: the probe skips ztunnel, other node traffic is captured.
    InpodRules(backend="nftables").apply(pod, PodRuleOptions(ipv6=True))
    assert probe(podnet, podnet.pod_ip, uid=KUBELET_UID) == ("app", "8080", PROBE_V4)
    assert probe(podnet, podnet.pod_ip6, uid=KUBELET_UID) == ("app", "8080", PROBE_V6)
    assert probe(podnet, podnet.pod_ip, uid=None)[:2] == ("inbound", "15006")
    assert landed(podnet, peer, "tcp", other_ip, 8080)[:2] == ("inbound", "15006")

    node.remove("uid-1", [podnet.pod_ip, podnet.pod_ip6])
    assert probe(podnet, podnet.pod_ip, uid=KUBELET_UID)[:2] == ("inbound", "15006")
    InpodRules(backend="nftables").remove(pod)
    node.add("uid-1", [podnet.pod_ip])
    node.remove_all()
    assert probe(podnet, podnet.pod_ip, uid=KUBELET_UID) == ("app", "8080", podnet.peer_ip)
    assert ambient_nft_apply.list_pod(pod) == "" and ruleset(peer) == ""
