"""Ambient mode's rules as the rule model: Istio's in-pod redirection and the node-side probe SNAT.

`pod_rules(options)` is Istio's `CreateInpodRules` (cni/pkg/iptables/iptables.go): inside an
enrolled pod, inbound TCP goes to ztunnel's plaintext port 15006 (15008, its HBONE port, is
reached directly), outbound TCP to 15001, DNS to 15053, except traffic ztunnel itself sends
(packet mark 0x539/0xfff). `host_rules(...)` is `CreateHostRulesForHealthChecks`: in the node's
namespace, TCP from a local socket (kubelet's probes) to an enrolled pod IP (the ipset
`istio-inpod-probes-v4`/`-v6`) is SNATed to the probe address, which the pod's rules let through.
Rule order and spelling follow Istio's builder, so `render_restore` prints Istio's golden text.
"""

from __future__ import annotations

from agent import constants
from agent.podinput.tokens import Address, Cidr, InterfaceName, Mark, Port, SetName, Word, Zone
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.collector import RETURN, AddressSlot, RuleCollector, jump
from agent.rules.model import Family, Match, RuleSet, Target
from agent.rules.ownership import Ownership, jumps_into

CHAIN_OUTPUT = "ISTIO_OUTPUT"
CHAIN_PREROUTING = "ISTIO_PRERT"
CHAIN_POSTROUTING = "ISTIO_POSTRT"

INPOD_MARK = Mark("0x539/0xfff")
"""ztunnel marks what it sends with 1337 (its in-pod config mark); never redirect those."""
INPOD_TPROXY_MARK = Mark("0x111/0xfff")
"""Connection mark of ztunnel's connections, restored onto replies (routed via table 100)."""
RESTORE_MASK = Mark("0xffffffff")
ROUTE_TABLE = "100"
"""Istio's RouteTableInbound: `local default dev lo` for packets with the TPROXY mark."""
RULE_PRIORITY = "32764"

ZTUNNEL_OUTBOUND_PORT = Port(constants.ZTUNNEL_OUTBOUND_PORT)
ZTUNNEL_INBOUND_PLAINTEXT_PORT = Port(constants.ZTUNNEL_INBOUND_PLAINTEXT_PORT)
ZTUNNEL_INBOUND_PORT = Port(constants.ZTUNNEL_INBOUND_PORT)
DNS_CAPTURE_PORT = Port(constants.ZTUNNEL_DNS_PORT)
DNS_PORT = Port("53")

PROBE_IPSET = "istio-inpod-probes"
PROBE_IPSET_V4 = f"{PROBE_IPSET}-v4"
PROBE_IPSET_V6 = f"{PROBE_IPSET}-v6"

LOOPBACK = (Cidr("127.0.0.1/32"), Cidr("::1/128"))
"""IPv4 and IPv6 loopback, the address slot of Istio's versioned loopback rules."""

POD_OWNERSHIP: Ownership = jumps_into(frozenset({CHAIN_OUTPUT, CHAIN_PREROUTING}))
"""In a pod: our two chains (in mangle, nat, raw) and the jumps into them, nothing else."""
HOST_OWNERSHIP: Ownership = jumps_into(frozenset({CHAIN_POSTROUTING}))
"""On the node: ISTIO_POSTRT and its jump; the node's other ISTIO_* chains are not ours."""


ACCEPT = jump("ACCEPT")
LO = InterfaceName("lo")
TCP = Match("proto", Word("tcp"))
UDP = Match("proto", Word("udp"))
MARKED = Match("mark", INPOD_MARK)
NOT_MARKED = Match("mark", INPOD_MARK, negate=True)


def redirect_dns(options: PodRuleOptions) -> bool:
    """The pod's own DNS setting wins over the node-wide one (Istio's PodLevelOverrides)."""
    if options.dns_proxy is None:
        return options.redirect_dns
    return options.dns_proxy == "enabled"


def pod_rules(options: PodRuleOptions) -> RuleSet:
    """Istio's in-pod rules for these options (AppendInpodRules, in its order)."""
    r = RuleCollector(ipv6=options.ipv6)
    dns = redirect_dns(options)
    probe = (options.probe_snat, options.probe_snat_v6)
    _jumps(r, dns)
    for iface in options.virtual_interfaces:
        # Inbound on a virtual NIC (KubeVirt, DinD, ...) is the workload's outbound.
        iface_tcp = [Match("in", iface), TCP]
        r.add("nat", CHAIN_PREROUTING, iface_tcp, Target("redirect", ZTUNNEL_OUTBOUND_PORT))
        r.add("nat", CHAIN_PREROUTING, iface_tcp, RETURN)
    r.add("mangle", CHAIN_PREROUTING, [MARKED], Target("connmark_set", INPOD_TPROXY_MARK))
    tcp_module = Match("module", Word("tcp"))
    if not options.ingress:
        # Kubelet's probes arrive SNATed to the probe address: let them through uncaptured.
        r.versioned("nat", CHAIN_PREROUTING, *probe, AddressSlot("src", TCP, tcp_module), ACCEPT)
    r.versioned("nat", CHAIN_OUTPUT, *probe, AddressSlot("dst", TCP, tcp_module), ACCEPT)
    if not options.ingress:
        inbound = AddressSlot("!dst", TCP, Match("dport", ZTUNNEL_INBOUND_PORT, True), NOT_MARKED)
        r.versioned(
            "nat",
            CHAIN_PREROUTING,
            *LOOPBACK,
            inbound,
            Target("redirect", ZTUNNEL_INBOUND_PLAINTEXT_PORT),
        )
    r.add(
        "mangle",
        CHAIN_OUTPUT,
        [Match("connmark", INPOD_TPROXY_MARK)],
        Target("restore_mark", mark=RESTORE_MASK),
    )
    if dns:
        _dns(r)
    r.add("nat", CHAIN_OUTPUT, [TCP, Match("mark", INPOD_TPROXY_MARK)], ACCEPT)
    # An app calling itself over lo by its pod address stays local.
    r.versioned("nat", CHAIN_OUTPUT, *LOOPBACK, AddressSlot("!dst", Match("out", LO)), ACCEPT)
    r.versioned(
        "nat",
        CHAIN_OUTPUT,
        *LOOPBACK,
        AddressSlot("!dst", TCP, NOT_MARKED),
        Target("redirect", ZTUNNEL_OUTBOUND_PORT),
    )
    return r.ruleset()


def _jumps(r: RuleCollector, dns: bool) -> None:
    r.add("mangle", "PREROUTING", [], jump(CHAIN_PREROUTING))
    r.add("mangle", "OUTPUT", [], jump(CHAIN_OUTPUT))
    r.add("nat", "OUTPUT", [], jump(CHAIN_OUTPUT))
    if dns:
        r.add("raw", "PREROUTING", [], jump(CHAIN_PREROUTING))
        r.add("raw", "OUTPUT", [], jump(CHAIN_OUTPUT))
    r.add("nat", "PREROUTING", [], jump(CHAIN_PREROUTING))


def _dns(r: RuleCollector) -> None:
    udp53 = [Match("module", Word("udp")), Match("dport", DNS_PORT)]
    r.add(
        "nat",
        CHAIN_OUTPUT,
        [Match("out", LO, True), UDP, NOT_MARKED, *udp53],
        Target("redirect", DNS_CAPTURE_PORT, spelling="--to-port"),
    )
    r.versioned(
        "nat",
        CHAIN_OUTPUT,
        *LOOPBACK,
        AddressSlot("!dst", TCP, Match("dport", DNS_PORT), NOT_MARKED),
        Target("redirect", DNS_CAPTURE_PORT),
    )
    # ztunnel's queries upstream and their answers get their own conntrack zone, so they do
    # not collide with the app's queries on the same ports (istio/istio#33469).
    r.add("raw", CHAIN_OUTPUT, [UDP, MARKED, *udp53], Target("ct_zone", Zone("1")))
    r.add(
        "raw",
        CHAIN_PREROUTING,
        [UDP, NOT_MARKED, Match("module", Word("udp")), Match("sport", DNS_PORT)],
        Target("ct_zone", Zone("1")),
    )


def host_rules(*, ipv6: bool, probe_snat: Address, probe_snat_v6: Address) -> RuleSet:
    """Istio's node-side rules (AppendHostRules): SNAT local-socket TCP to enrolled pod IPs.

    `--socket-exists` tells a packet from a node process (kubelet) from one forwarded for a
    Service (kube-proxy), which must stay captured.
    """
    r = RuleCollector(ipv6=ipv6)
    r.add("nat", "POSTROUTING", [], jump(CHAIN_POSTROUTING), insert_at=1)
    for family, ipset, address in (
        (4, PROBE_IPSET_V4, probe_snat),
        (6, PROBE_IPSET_V6, probe_snat_v6),
    ):
        fam: Family = 4 if family == 4 else 6
        r.add(
            "nat",
            CHAIN_POSTROUTING,
            [Match("socket_exists", Word("tcp")), TCP, Match("match_set", SetName(ipset))],
            Target("snat", address),
            families=(fam,),
        )
    return r.ruleset()
