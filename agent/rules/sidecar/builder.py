"""Build the rule model for a CaptureConfig, in the order and shape of Istio's istio-iptables.

The order matters twice: iptables evaluates rules in order, and users compare our
`iptables-restore` input with Istio's byte for byte. Each step below is one of Istio's steps,
in Istio's sequence; a rule is added to IPv4, IPv6 or both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from agent import constants
from agent.podinput.tokens import (
    ChainName,
    Cidr,
    InterfaceName,
    Mark,
    Port,
    PortList,
    Word,
    Zone,
)
from agent.rules.collector import RETURN, AddressSlot, RuleCollector, dst, jump, src
from agent.rules.model import Family, Match, RuleSet, TableName, Target
from agent.rules.sidecar.capture import (
    WILDCARD,
    CaptureConfig,
    GroupValue,
    IdValue,
    InterfaceValue,
    PortValue,
    cidr_is_loopback,
    is_ipv4_cidr,
)

DNS_PORT = Port("53")
AGENT_DNS_PORT = Port(constants.AGENT_DNS_PORT)
OUTBOUND_MARK = Mark(constants.OUTBOUND_MARK)
INBOUND_PASSTHROUGH_V4 = Cidr(constants.INBOUND_PASSTHROUGH_V4)
INBOUND_PASSTHROUGH_V6 = Cidr(constants.INBOUND_PASSTHROUGH_V6)
LOOPBACK_V6 = Cidr(constants.LOOPBACK_V6)

# Chain names (Istio's).
INBOUND = ChainName("ISTIO_INBOUND")
REDIRECT = ChainName("ISTIO_REDIRECT")
IN_REDIRECT = ChainName("ISTIO_IN_REDIRECT")
OUTPUT = ChainName("ISTIO_OUTPUT")
OUTPUT_DNS = ChainName("ISTIO_OUTPUT_DNS")
DIVERT = ChainName("ISTIO_DIVERT")
TPROXY = ChainName("ISTIO_TPROXY")
DROP = ChainName("ISTIO_DROP")

LO = InterfaceName("lo")


# Short constructors keep each rule on one line, readable next to its iptables form.
def proto(p: str) -> Match:
    """`-p tcp` or `-p udp` (a word of this code, checked as one)."""
    return Match("proto", Word(p))


def dport(port: PortValue, negate: bool = False) -> Match:
    return Match("dport", port, negate)


def sport(port: PortValue) -> Match:
    return Match("sport", port)


def in_if(name: InterfaceValue) -> Match:
    return Match("in", name)


def out_if(name: InterfaceValue) -> Match:
    return Match("out", name)


def uid(value: IdValue, negate: bool = False) -> Match:
    return Match("uid", value, negate)


def gid(value: GroupValue | IdValue, negate: bool = False) -> Match:
    return Match("gid", value, negate)


def build(config: CaptureConfig) -> RuleSet:
    """The full rule set for `config`: IPv4 tables, then IPv6 tables when IPv6 is on."""
    b = RuleCollector(ipv6=config.enable_ipv6)
    loop4, loop6 = config.host_ipv4_loopback_cidr, LOOPBACK_V6
    include = config.outbound_ip_ranges_include
    include_v4 = [] if include == WILDCARD else [c for c in include if is_ipv4_cidr(c)]
    include_v6 = [] if include == WILDCARD else [c for c in include if not is_ipv4_cidr(c)]
    include_has_loopback = any(cidr_is_loopback(c) for c in include_v4 + include_v6)
    exclude_v4 = [c for c in config.outbound_ip_ranges_exclude if is_ipv4_cidr(c)]
    exclude_v6 = [c for c in config.outbound_ip_ranges_exclude if not is_ipv4_cidr(c)]
    dns = config.redirect_dns and (
        config.capture_all_dns or bool(config.dns_servers_v4) or bool(config.dns_servers_v6)
    )

    _exclude_interfaces(b, config)
    for name in config.reroute_virtual_interfaces:
        b.add("nat", "PREROUTING", [in_if(name)], RETURN, insert_at=1)
    if config.drop_invalid:
        b.add("mangle", "PREROUTING", [Match("ctstate", Word("INVALID"))], jump(DROP))
        b.add("mangle", DROP, [], jump("DROP"))
    b.add("nat", INBOUND, [proto("tcp"), dport(config.inbound_tunnel_port)], RETURN)
    b.add("nat", REDIRECT, [proto("tcp")], _redirect(config.proxy_port, "--to-ports"))
    b.add("nat", IN_REDIRECT, [proto("tcp")], _redirect(config.inbound_capture_port, "--to-ports"))
    _inbound(b, config, loop4)
    b.add("nat", "OUTPUT", [], jump(OUTPUT))
    for port in config.outbound_ports_exclude:
        b.add("nat", OUTPUT, [proto("tcp"), dport(port)], RETURN)
        b.add("nat", OUTPUT, [proto("udp"), dport(port)], RETURN)
    b.versioned(
        "nat",
        OUTPUT,
        INBOUND_PASSTHROUGH_V4,
        INBOUND_PASSTHROUGH_V6,
        AddressSlot(out_if(LO), "src"),
        RETURN,
    )
    _proxy_owner_rules(b, config, dns=dns, keep_loopback=include_has_loopback)
    _owner_groups(b, config)
    if dns:
        _dns(b, config)
    b.versioned("nat", OUTPUT, loop4, loop6, AddressSlot("dst"), RETURN)
    for cidr in exclude_v4:
        b.add("nat", OUTPUT, [dst(cidr)], RETURN, families=(4,))
    for cidr in exclude_v6:
        b.add("nat", OUTPUT, [dst(cidr)], RETURN, families=(6,))
    for port in config.outbound_ports_include:
        b.add("nat", OUTPUT, [proto("tcp"), dport(port)], jump(REDIRECT))
    _outbound_include(b, config, include == WILDCARD, include_v4, family=4)
    _outbound_include(b, config, include == WILDCARD, include_v6, family=6)
    if config.tproxy:
        _tproxy_marks(b, config, loop4)
    return b.ruleset()


def _proxy_owners(config: CaptureConfig) -> list[tuple[Literal["uid", "gid"], IdValue]]:
    """The proxy's UIDs then GIDs, in Istio's order."""
    uids: list[tuple[Literal["uid", "gid"], IdValue]] = [("uid", v) for v in config.proxy_uids]
    return uids + [("gid", v) for v in config.proxy_gids]


def _redirect(port: Port, spelling: str) -> Target:
    return Target("redirect", port, spelling=spelling)


def _exclude_interfaces(b: RuleCollector, config: CaptureConfig) -> None:
    for name in config.exclude_interfaces:
        b.add("nat", "PREROUTING", [in_if(name)], RETURN)
        b.add("nat", "OUTPUT", [out_if(name)], RETURN)
    if config.tproxy:
        for name in config.exclude_interfaces:
            b.add("mangle", "PREROUTING", [in_if(name)], RETURN)
            b.add("mangle", "OUTPUT", [out_if(name)], RETURN)


def _inbound(b: RuleCollector, config: CaptureConfig, loop4: Cidr) -> None:
    """Inbound capture: nat REDIRECT to the capture port, or mangle TPROXY."""
    include = config.inbound_ports_include
    if not include and not config.inbound_ports_set:
        return
    table: TableName = "nat"
    if config.tproxy:
        table = "mangle"
        b.add("mangle", DIVERT, [], Target("set_mark", config.tproxy_mark))
        b.add("mangle", DIVERT, [], jump("ACCEPT"))
        b.versioned(
            "mangle",
            TPROXY,
            loop4,
            LOOPBACK_V6,
            AddressSlot("!dst", proto("tcp")),
            Target("tproxy", config.inbound_capture_port, mark=config.tproxy_mark),
        )
    b.add(table, "PREROUTING", [proto("tcp")], jump(INBOUND))
    established = Match("ctstate", Word("RELATED,ESTABLISHED"))
    if include == WILDCARD:
        for port in config.inbound_ports_exclude:
            b.add(table, INBOUND, [proto("tcp"), dport(port)], RETURN)
        if config.tproxy:
            b.add("mangle", INBOUND, [proto("tcp"), established], jump(DIVERT))
            b.add("mangle", INBOUND, [proto("tcp")], jump(TPROXY))
        else:
            b.add("nat", INBOUND, [proto("tcp")], jump(IN_REDIRECT))
        return
    for port in include:
        if config.tproxy:
            b.add("mangle", INBOUND, [proto("tcp"), dport(port), established], jump(DIVERT))
            b.add("mangle", INBOUND, [proto("tcp"), dport(port)], jump(TPROXY))
        else:
            b.add("nat", INBOUND, [proto("tcp"), dport(port)], jump(IN_REDIRECT))


def _proxy_owner_rules(
    b: RuleCollector, config: CaptureConfig, *, dns: bool, keep_loopback: bool
) -> None:
    """The proxy's own traffic is never captured, except its calls back to the app over lo."""
    loop4 = config.host_ipv4_loopback_cidr
    tunnel = config.inbound_tunnel_port
    for owner, value in _proxy_owners(config):
        me = Match(owner, value)
        not_me = Match(owner, value, negate=True)
        # Istio skips port 53 only for UIDs in the self-call rule.
        if dns and owner == "uid":
            ports = Match("dports", PortList.of((DNS_PORT, tunnel)), negate=True)
        else:
            ports = dport(tunnel, negate=True)
        b.versioned(
            "nat",
            OUTPUT,
            loop4,
            LOOPBACK_V6,
            AddressSlot(out_if(LO), "!dst", proto("tcp"), ports, me),
            jump(IN_REDIRECT),
        )
        if not keep_loopback:
            if dns:
                matches = [out_if(LO), proto("tcp"), dport(DNS_PORT, negate=True), not_me]
            else:
                matches = [out_if(LO), not_me]
            b.add("nat", OUTPUT, matches, RETURN)
        b.add("nat", OUTPUT, [me], RETURN)


def _owner_groups(b: RuleCollector, config: CaptureConfig) -> None:
    if config.owner_groups_include == WILDCARD:
        for group in config.owner_groups_exclude:
            b.add("nat", OUTPUT, [gid(group)], RETURN)
        return
    b.add("nat", OUTPUT, [gid(group, negate=True) for group in config.owner_groups_include], RETURN)


def _dns(b: RuleCollector, config: CaptureConfig) -> None:
    """DNS to the agent's resolver (nat) and conntrack zones that keep its flows apart (raw)."""
    all_dns = config.capture_all_dns
    v4, v6 = config.dns_servers_v4, config.dns_servers_v6
    b.add("raw", "OUTPUT", [], jump(OUTPUT_DNS))
    if all_dns or v4:
        b.add("nat", OUTPUT, [], jump(OUTPUT_DNS), families=(4,))
    if all_dns or v6:
        b.add("nat", OUTPUT, [], jump(OUTPUT_DNS), families=(6,))
    for p, spelling in (("tcp", "--to-ports"), ("udp", "--to-port")):
        to_agent = _redirect(AGENT_DNS_PORT, spelling)
        if all_dns:
            b.add("nat", OUTPUT_DNS, [proto(p), dport(DNS_PORT)], to_agent)
            continue
        for server in v4:
            b.add(
                "nat",
                OUTPUT_DNS,
                [proto(p), dport(DNS_PORT), dst(Cidr(f"{server}/32"))],
                to_agent,
                families=(4,),
            )
        for server in v6:
            b.add(
                "nat",
                OUTPUT_DNS,
                [proto(p), dport(DNS_PORT), dst(Cidr(f"{server}/128"))],
                to_agent,
                families=(6,),
            )
    zone1, zone2 = Target("ct_zone", Zone("1")), Target("ct_zone", Zone("2"))
    for owner, value in _proxy_owners(config):
        me = Match(owner, value)
        b.add("raw", OUTPUT_DNS, [proto("udp"), dport(DNS_PORT), me], zone1)
        b.add("raw", OUTPUT_DNS, [proto("udp"), sport(AGENT_DNS_PORT), me], zone2)
    if all_dns:
        b.add("raw", "PREROUTING", [], jump(INBOUND))
        b.add("raw", OUTPUT_DNS, [proto("udp"), dport(DNS_PORT)], zone2)
        b.add("raw", INBOUND, [proto("udp"), sport(DNS_PORT)], zone1)
        return
    for family, servers, bits in ((4, v4, "32"), (6, v6, "128")):
        fam: tuple[Family, ...] = (4,) if family == 4 else (6,)
        if servers:
            b.add("raw", "PREROUTING", [], jump(INBOUND), families=fam)
        for server in servers:
            b.add(
                "raw",
                OUTPUT_DNS,
                [proto("udp"), dport(DNS_PORT), dst(Cidr(f"{server}/{bits}"))],
                zone2,
                families=fam,
            )
            b.add(
                "raw",
                INBOUND,
                [proto("udp"), sport(DNS_PORT), src(Cidr(f"{server}/{bits}"))],
                zone1,
                families=fam,
            )


def _outbound_include(
    b: RuleCollector,
    config: CaptureConfig,
    wildcard: bool,
    cidrs: Sequence[Cidr],
    *,
    family: Family,
) -> None:
    fam: tuple[Family, ...] = (family,)
    if wildcard:
        b.add("nat", OUTPUT, [], jump(REDIRECT), families=fam)
        for name in config.reroute_virtual_interfaces:
            b.add("nat", "PREROUTING", [in_if(name)], jump(REDIRECT), families=fam, insert_at=1)
        return
    for cidr in cidrs:
        for name in config.reroute_virtual_interfaces:
            b.add(
                "nat",
                "PREROUTING",
                [in_if(name), dst(cidr)],
                jump(REDIRECT),
                families=fam,
                insert_at=1,
            )
        b.add("nat", OUTPUT, [dst(cidr)], jump(REDIRECT), families=fam)


def _tproxy_marks(b: RuleCollector, config: CaptureConfig, loop4: Cidr) -> None:
    """TPROXY bookkeeping: keep the mark on the connection, skip proxy-to-app loops."""
    mark = config.tproxy_mark
    tcp = proto("tcp")
    b.add("mangle", "PREROUTING", [tcp, Match("mark", mark)], Target("save_mark"))
    b.add("mangle", "OUTPUT", [tcp, out_if(LO), Match("mark", mark)], RETURN)
    for owner, value in _proxy_owners(config):
        me = Match(owner, value)
        b.versioned(
            "mangle",
            "OUTPUT",
            loop4,
            LOOPBACK_V6,
            AddressSlot("!dst", tcp, out_if(LO), me),
            Target("set_mark", OUTBOUND_MARK),
        )
    b.add("mangle", "OUTPUT", [tcp, Match("connmark", mark)], Target("restore_mark"))
    b.add("mangle", INBOUND, [tcp, Match("mark", mark)], RETURN, insert_at=1)
    b.add(
        "mangle",
        INBOUND,
        [tcp, src(INBOUND_PASSTHROUGH_V4), in_if(LO)],
        RETURN,
        families=(4,),
        insert_at=2,
    )
    b.add(
        "mangle",
        INBOUND,
        [tcp, src(INBOUND_PASSTHROUGH_V6), in_if(LO)],
        RETURN,
        families=(6,),
        insert_at=2,
    )
    b.add(
        "mangle",
        INBOUND,
        [tcp, in_if(LO), Match("mark", OUTBOUND_MARK, negate=True)],
        RETURN,
        insert_at=3,
    )
