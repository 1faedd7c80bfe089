"""Ambient mode's rules in real namespaces: read-back, idempotence, removal and real traffic.

In-pod: what each backend leaves in the kernel equals what Istio's golden text leaves when
restored as-is; applying twice leaves one copy; removal restores the namespace exactly (other
software's rules, a sidecar-mode chain and the filter table untouched). Traffic: from a pod with
the rules, outbound TCP lands on 15001, inbound on 15006, 15008 is reached directly, DNS on
15053. Node side: in a "node" namespace wired to the pod, a local TCP connection to an enrolled
pod IP arrives SNATed to the probe address, and to a non-enrolled IP with its own source.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent.netns import run_command
from agent.podinput.tokens import Address, InterfaceName
from agent.rules import backend_nft, backend_restore
from agent.rules.ambient import nft as ambient_nft
from agent.rules.ambient import nft_apply as ambient_nft_apply
from agent.rules.ambient.apply import HostProbeRules, InpodRules
from agent.rules.ambient.builder import HOST_OWNERSHIP, POD_OWNERSHIP, host_rules, pod_rules
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.model import BUILTIN_CHAINS
from agent.rules.render_save import parse_save
from tests.conformance_data import AMBIENT_DIR
from tests.rules.podnet import PodNet, _enter, sh

pytestmark = pytest.mark.netns

IPTABLES_BACKENDS = ["python-iptables", "iptables-legacy", "iptables-nft"]
PROBE_V4 = "169.254.7.127"
PROBE_V6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
GOLDEN_PROBE_V6 = "e9ac:1e77:90ca:399f:4d6d:ece2:2f9b:3164"

# Istio's golden cases and the options they were made with (ambient/*/case.json).
POD_CASES = {
    "default_ipv6": PodRuleOptions(ipv6=True, probe_snat_v6=Address(GOLDEN_PROBE_V6)),
    "ingress_and_virtual_interfaces": PodRuleOptions(
        ipv6=False,
        redirect_dns=False,
        ingress=True,
        virtual_interfaces=(InterfaceName("fake1s0f0"), InterfaceName("fake1s0f1")),
    ),
    "dns_pod_enabled_and_off_globally_ipv6": PodRuleOptions(
        ipv6=True, redirect_dns=False, dns_proxy="enabled", probe_snat_v6=Address(GOLDEN_PROBE_V6)
    ),
}

# Reports where a connection landed and who it came from: "LABEL|LOCAL_PORT|PEER_ADDRESS".
SOURCE_SERVER = r"""
import socket, sys, threading
def serve(sock, label, udp):
    while True:
        if udp:
            _, peer = sock.recvfrom(2048)
            sock.sendto(f"{label}|{sock.getsockname()[1]}|{peer[0]}".encode(), peer)
            continue
        conn, peer = sock.accept()
        with conn:
            conn.sendall(f"{label}|{conn.getsockname()[1]}|{peer[0]}".encode())
for spec in sys.argv[1:]:
    proto, port, label = spec.split(":")
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        udp = proto == "udp"
        sock = socket.socket(family, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, int(port)))
        if not udp:
            sock.listen(16)
        threading.Thread(target=serve, args=(sock, label, udp), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def serve(net: PodNet, ns_path: str, specs: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", SOURCE_SERVER, *specs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_enter(ns_path, None),
    )
    net.procs.append(proc)  # the podnet fixture kills it
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""


def landed(net: PodNet, ns_path: str, proto: str, host: str, port: int) -> tuple[str, str, str]:
    answer = net.call(ns_path, proto, host, port)
    parts = answer.split("|")
    assert len(parts) == 3, answer
    return parts[0], parts[1], parts[2]


def save_text(ns_path: str, tool: str) -> dict[str, dict[str, list[str]]]:
    """Every chain and rule the -save tool prints, by table; a table holding nothing but empty
    built-in chains counts as absent (a table, once used, stays loaded)."""
    tables = parse_save(run_command(ns_path, [tool]).stdout)
    return {
        name: chains
        for name, chains in tables.items()
        if any(rules or chain not in BUILTIN_CHAINS for chain, rules in chains.items())
    }


def variant_of(backend: str) -> str:
    return "nft" if backend == "iptables-nft" else "legacy"


def golden_restore(case: str, family: int) -> str:
    """The IPv4 (first) or IPv6 (second) restore input of Istio's golden."""
    lines = (AMBIENT_DIR / case / "golden.txt").read_text().splitlines()
    body = [line for line in lines if line.strip() not in ("iptables-save", "ip6tables-save")]
    blocks: list[list[str]] = []
    seen: set[str] = set()
    for line in body:
        if line.startswith("* "):
            if not blocks or line in seen:
                blocks.append([])
                seen = set()
            seen.add(line)
        blocks[-1].append(line.replace("* ", "*", 1) if line.startswith("* ") else line)
    return "\n".join(blocks[family // 6]) + "\n"


@pytest.fixture
def scratch() -> Iterator[str]:
    """A bare namespace to restore Istio's golden text into."""
    name = f"icni-golden-{id(object()) & 0xFFFFFF:x}"
    sh("ip", "netns", "add", name)
    try:
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@pytest.mark.parametrize("backend", IPTABLES_BACKENDS)
@pytest.mark.parametrize("case", sorted(POD_CASES))
def test_inpod_rules_read_back_as_istios_golden(
    podnet: PodNet, scratch: str, backend: str, case: str
) -> None:
    options = POD_CASES[case]
    variant = variant_of(backend)
    rules = InpodRules(backend=backend)
    assert rules.apply(podnet.pod_path, options) == backend
    for family in (4, 6) if options.ipv6 else (4,):
        restore = "iptables" if family == 4 else "ip6tables"
        done = run_command(
            scratch, [f"{restore}-{variant}-restore", "--noflush"], golden_restore(case, family)
        )
        assert done.returncode == 0, done.stderr
        want = backend_restore.ours(
            backend_restore.read_state(scratch, variant, family), POD_OWNERSHIP
        )
        got = backend_restore.ours(
            backend_restore.read_state(podnet.pod_path, variant, family), POD_OWNERSHIP
        )
        assert got == want and got
    assert rules.present(podnet.pod_path, options)


@pytest.mark.parametrize("backend", IPTABLES_BACKENDS)
def test_inpod_apply_twice_then_remove_restores_the_namespace(podnet: PodNet, backend: str) -> None:
    pod = podnet.pod_path
    variant = variant_of(backend)
    tool = f"iptables-{variant}"
    # Other software's rules, a sidecar-mode chain and the filter table must survive.
    for args in (
        ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT"],
        ["-t", "nat", "-N", "ISTIO_INBOUND"],
        ["-t", "nat", "-A", "ISTIO_INBOUND", "-p", "tcp", "--dport", "7777", "-j", "RETURN"],
        ["-t", "mangle", "-A", "PREROUTING", "-p", "udp", "-j", "MARK", "--set-mark", "7"],
        ["-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
    ):
        assert run_command(pod, [tool, *args]).returncode == 0
    before = save_text(pod, f"{tool}-save")
    rules_before = run_command(pod, ["ip", "rule"]).stdout
    options = PodRuleOptions(ipv6=True)
    rules = InpodRules(backend=backend)
    rules.apply(pod, options)
    rules.apply(pod, options)
    state = backend_restore.read_state(pod, variant, 4)
    assert backend_restore.ours(state, POD_OWNERSHIP) == backend_restore.expected(
        pod_rules(options).v4, 4, POD_OWNERSHIP
    )
    assert state["nat"]["OUTPUT"].count("-A OUTPUT -j ISTIO_OUTPUT") == 1
    assert "-A ISTIO_INBOUND -p tcp -m tcp --dport 7777 -j RETURN" in state["nat"]["ISTIO_INBOUND"]
    ip_rules = run_command(pod, ["ip", "rule"]).stdout
    assert ip_rules.count("fwmark 0x111/0xfff lookup 100") == 1, ip_rules
    assert run_command(pod, ["ip", "-6", "rule"]).stdout.count("lookup 100") == 1
    assert (
        "local default dev lo" in run_command(pod, ["ip", "route", "show", "table", "100"]).stdout
    )

    rules.remove(pod)
    assert save_text(pod, f"{tool}-save") == before
    assert run_command(pod, ["ip", "rule"]).stdout == rules_before
    assert run_command(pod, ["ip", "route", "show", "table", "100"]).stdout == ""
    assert not rules.present(pod, options)
    rules.remove(pod)  # nothing left to remove is fine


def test_present_sees_a_changed_rule(podnet: PodNet) -> None:
    pod = podnet.pod_path
    options = PodRuleOptions(ipv6=False)
    rules = InpodRules(backend="iptables-nft")
    rules.apply(pod, options)
    assert rules.present(pod, options)
    assert not rules.present(pod, PodRuleOptions(ipv6=False, ingress=True))
    run_command(pod, ["iptables-nft", "-t", "nat", "-D", "ISTIO_OUTPUT", "2"])
    assert not rules.present(pod, options)
    rules.apply(pod, options)  # reconcile puts the whole set back
    assert rules.present(pod, options)


def test_nftables_backend_reads_back_and_removes_only_its_tables(podnet: PodNet) -> None:
    pod = podnet.pod_path
    foreign = "table inet other {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\t}\n}\n"
    assert run_command(pod, ["nft", "-f", "-"], foreign).returncode == 0
    options = PodRuleOptions(ipv6=True, virtual_interfaces=(InterfaceName("v0"),))
    rules = InpodRules(backend="nftables")
    rules.apply(pod, options)
    rules.apply(pod, options)
    # What `nft list` prints back is Istio's native nftables rules for ambient, once.
    assert backend_nft.normalize(ambient_nft_apply.list_pod(pod)) == backend_nft.normalize(
        backend_nft.expected_listing(ambient_nft.render_pod(options))
    )
    assert rules.present(pod, options)
    rules.remove(pod)
    assert ambient_nft_apply.list_pod(pod) == ""
    assert "table inet other" in run_command(pod, ["nft", "list", "tables"]).stdout
    assert run_command(pod, ["ip", "route", "show", "table", "100"]).stdout == ""


@pytest.mark.parametrize("backend", ["iptables-legacy", "iptables-nft", "nftables"])
def test_traffic_is_redirected_to_ztunnels_ports(podnet: PodNet, backend: str) -> None:
    pod, peer = podnet.pod_path, podnet.peer_path
    serve(
        podnet,
        pod,
        [
            "tcp:15001:outbound",
            "tcp:15006:inbound",
            "tcp:15008:hbone",
            "tcp:8080:app",
            "udp:15053:dns",
            "tcp:15053:dns",
        ],
    )
    serve(podnet, peer, ["tcp:8080:peer", "udp:53:peer-dns"])
    # Before: plain connections both ways.
    assert landed(podnet, pod, "tcp", podnet.peer_ip, 8080)[0] == "peer"
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080)[0] == "app"

    InpodRules(backend=backend).apply(pod, PodRuleOptions(ipv6=True))
    for peer_ip in (podnet.peer_ip, podnet.peer_ip6):
        assert landed(podnet, pod, "tcp", peer_ip, 8080)[:2] == ("outbound", "15001")
    assert landed(podnet, pod, "udp", podnet.peer_ip, 53)[:2] == ("dns", "15053")
    for pod_ip in (podnet.pod_ip, podnet.pod_ip6):
        label, port, source = landed(podnet, peer, "tcp", pod_ip, 8080)
        assert (label, port) == ("inbound", "15006") and source in (podnet.peer_ip, podnet.peer_ip6)
        assert landed(podnet, peer, "tcp", pod_ip, 15008)[:2] == ("hbone", "15008")
    # The pod calling itself over lo stays local (Istio's `-o lo -j ACCEPT`).
    assert landed(podnet, pod, "tcp", podnet.pod_ip, 8080)[0] == "app"

    InpodRules(backend=backend).remove(pod)
    assert landed(podnet, pod, "tcp", podnet.peer_ip, 8080)[0] == "peer"
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080)[0] == "app"


@pytest.fixture
def node(podnet: PodNet) -> Iterator[HostProbeRules]:
    """The peer namespace plays the node; the pod routes everything back through it."""
    sh("ip", "-n", podnet.pod, "route", "add", "default", "via", podnet.peer_ip)
    sh("ip", "-n", podnet.pod, "-6", "route", "add", "default", "via", podnet.peer_ip6)
    rules = HostProbeRules(podnet.peer_path, ipv6=True, probe_snat=PROBE_V4, probe_snat_v6=PROBE_V6)
    try:
        yield rules
    finally:
        rules.remove_all()


@pytest.mark.parametrize("backend", IPTABLES_BACKENDS)
def test_host_rules_read_back_and_remove_cleanly(podnet: PodNet, backend: str) -> None:
    peer = podnet.peer_path
    variant = variant_of(backend)
    tool = f"iptables-{variant}"
    foreign = [tool, "-t", "nat", "-A", "POSTROUTING", "-j", "RETURN"]
    assert run_command(peer, foreign).returncode == 0
    before = save_text(peer, f"{tool}-save")
    rules = HostProbeRules(
        peer, ipv6=True, probe_snat=PROBE_V4, probe_snat_v6=PROBE_V6, backend=backend
    )
    rules.ensure()
    rules.ensure()
    ruleset = host_rules(ipv6=True, probe_snat=Address(PROBE_V4), probe_snat_v6=Address(PROBE_V6))
    for family in (4, 6):
        state = backend_restore.read_state(peer, variant, family)
        assert backend_restore.ours(state, HOST_OWNERSHIP) == backend_restore.expected(
            ruleset.family(family), family, HOST_OWNERSHIP
        )
        # Inserted first, ahead of the rule that was there.
        assert state["nat"]["POSTROUTING"][0] == "-A POSTROUTING -j ISTIO_POSTRT"
    assert parse_save(run_command(peer, [f"{tool}-save"]).stdout)["nat"]["ISTIO_POSTRT"] == [
        "-A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set "
        f"istio-inpod-probes-v4 dst -j SNAT --to-source {PROBE_V4}"
    ]
    assert rules.present()
    rules.remove_all()
    assert save_text(peer, f"{tool}-save") == before
    assert run_command(peer, ["ip", "link"]).returncode == 0
    with pytest.raises(Exception, match="No such file"):
        rules.sets.entries()  # the sets are gone too


def check_entries_carry_the_pod_uid(podnet: PodNet, node: HostProbeRules) -> None:
    """Add, re-add, hand over to a newer pod, remove and sync, on either backend's sets."""
    node.ensure()
    node.add("uid-a", [podnet.pod_ip, podnet.pod_ip6])
    node.add("uid-a", [podnet.pod_ip])  # idempotent
    assert node.entries() == {podnet.pod_ip: "uid-a", podnet.pod_ip6: "uid-a"}
    node.add("uid-b", [podnet.pod_ip])  # the IP now belongs to a newer pod
    node.remove("uid-a", [podnet.pod_ip, podnet.pod_ip6])  # leaves uid-b's entry
    assert node.entries() == {podnet.pod_ip: "uid-b"}
    node.sync([("uid-c", ["10.99.0.1", "fd99::1"]), ("uid-b", [podnet.pod_ip])])
    assert node.entries() == {"10.99.0.1": "uid-c", "fd99::1": "uid-c", podnet.pod_ip: "uid-b"}


def test_set_entries_carry_the_pod_uid(podnet: PodNet, node: HostProbeRules) -> None:
    check_entries_carry_the_pod_uid(podnet, node)
    node.ensure()  # start-up again: entries are kept
    assert len(node.entries()) == 3
    node.sync([])
    assert node.entries() == {}


def test_probes_to_enrolled_pods_are_snated(podnet: PodNet, node: HostProbeRules) -> None:
    pod, peer = podnet.pod_path, podnet.peer_path
    other_ip = podnet.pod_ip.rsplit(".", 1)[0] + ".3"  # a second pod IP, never enrolled
    sh("ip", "-n", podnet.pod, "addr", "add", f"{other_ip}/24", "dev", "eth0")
    serve(podnet, pod, ["tcp:8080:app", "tcp:15006:inbound"])
    node.ensure()
    node.add("uid-1", [podnet.pod_ip, podnet.pod_ip6])
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080) == ("app", "8080", PROBE_V4)
    assert landed(podnet, peer, "tcp", podnet.pod_ip6, 8080) == ("app", "8080", PROBE_V6)
    assert landed(podnet, peer, "tcp", other_ip, 8080) == ("app", "8080", podnet.peer_ip)

    # With the pod's own rules: the probe skips ztunnel, other node traffic is captured.
    InpodRules(backend="iptables-nft").apply(pod, PodRuleOptions(ipv6=True))
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080) == ("app", "8080", PROBE_V4)
    assert landed(podnet, peer, "tcp", other_ip, 8080)[:2] == ("inbound", "15006")

    node.remove("uid-1", [podnet.pod_ip, podnet.pod_ip6])
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080)[:2] == ("inbound", "15006")
    InpodRules(backend="iptables-nft").remove(pod)
    node.add("uid-1", [podnet.pod_ip])
    node.remove_all()
    assert landed(podnet, peer, "tcp", podnet.pod_ip, 8080) == ("app", "8080", podnet.peer_ip)
