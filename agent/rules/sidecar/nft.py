"""Istio's native nftables rules for a CaptureConfig (sidecar mode, `--native-nftables`).

Istio's nftables mode is not a translation of its iptables rules: it writes its own rules into
three `inet` tables (`istio-proxy-nat`, `-mangle`, `-raw`) with lower-case chains, in its own
order, and some steps differ from the iptables ones (one wildcard jump for both families, DNS
zone rules in another order, inserts by nftables index). Each step below is one of Istio's, in
Istio's sequence; expressions are Istio's words joined by spaces, values as the user spelled them.
`render_nft.render_native` turns the result into the `nft -f` commands Istio's transaction prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agent import constants
from agent.podinput.tokens import Cidr
from agent.rules.model import check_nft_rule
from agent.rules.sidecar.capture import WILDCARD, CaptureConfig, cidr_is_loopback, is_ipv4_cidr

NftTable = Literal["nat", "mangle", "raw"]
TABLE_ORDER: tuple[NftTable, ...] = ("nat", "mangle", "raw")
TABLE_PREFIX = "istio-proxy-"

PREROUTING, OUTPUT = "prerouting", "output"
INBOUND, OUTPUT_CHAIN, OUTPUT_DNS = "istio-inbound", "istio-output", "istio-output-dns"
REDIRECT, IN_REDIRECT = "istio-redirect", "istio-in-redirect"
DIVERT, TPROXY, DROP = "istio-divert", "istio-tproxy", "istio-drop"

BASE_CHAINS: dict[tuple[NftTable, str], str] = {
    ("nat", PREROUTING): "type nat hook prerouting priority -100 ;",
    ("nat", OUTPUT): "type nat hook output priority -100 ;",
    ("mangle", PREROUTING): "type filter hook prerouting priority -150 ;",
    ("mangle", OUTPUT): "type route hook output priority -150 ;",
    ("raw", PREROUTING): "type filter hook prerouting priority -300 ;",
    ("raw", OUTPUT): "type filter hook output priority -300 ;",
}
"""Base chains at Istio's priorities (dstnat, mangle, raw), written as numbers as knftables does."""

CHAINS: dict[NftTable, tuple[str, ...]] = {
    "nat": (PREROUTING, OUTPUT, INBOUND, REDIRECT, IN_REDIRECT, OUTPUT_CHAIN, OUTPUT_DNS),
    "mangle": (PREROUTING, OUTPUT, DIVERT, TPROXY, INBOUND, DROP),
    "raw": (PREROUTING, OUTPUT, INBOUND, OUTPUT_DNS),
}
"""Each table's chains in the order Istio declares them (only those with rules are created)."""

OUTBOUND_MARK = constants.OUTBOUND_MARK
AGENT_DNS_PORT = constants.AGENT_DNS_PORT
AGENT_DNS = ":" + AGENT_DNS_PORT
PASSTHROUGH_V4 = constants.INBOUND_PASSTHROUGH_V4
PASSTHROUGH_V6 = constants.INBOUND_PASSTHROUGH_V6
LOOP6 = constants.LOOPBACK_V6


@dataclass(frozen=True)
class NftRule:
    table: NftTable
    chain: str
    expr: str
    index: int | None = None
    """Insert before this position (Istio's InsertRule); None appends."""

    def __post_init__(self) -> None:
        check_nft_rule(self.chain, self.expr)


@dataclass
class _Rules:
    ipv6: bool
    rules: list[NftRule] = field(default_factory=list)

    def add(self, table: NftTable, chain: str, *words: str, v6: bool = False) -> None:
        if not v6 or self.ipv6:
            self.rules.append(NftRule(table, chain, " ".join(words)))

    def insert(
        self, table: NftTable, chain: str, index: int, *words: str, v6: bool = False
    ) -> None:
        if not v6 or self.ipv6:
            self.rules.append(NftRule(table, chain, " ".join(words), index))


def build_native(config: CaptureConfig) -> list[NftRule]:
    """Istio's rules for `config`, in the order its nftables configurator adds them."""
    r = _Rules(ipv6=config.enable_ipv6)
    loop4 = config.host_ipv4_loopback_cidr
    include = config.outbound_ip_ranges_include
    include_v4 = [] if include == WILDCARD else [c for c in include if is_ipv4_cidr(c)]
    include_v6 = [] if include == WILDCARD else [c for c in include if not is_ipv4_cidr(c)]
    keep_loopback = any(cidr_is_loopback(c) for c in [*include_v4, *include_v6])
    dns = config.redirect_dns and (
        config.capture_all_dns or bool(config.dns_servers_v4) or bool(config.dns_servers_v6)
    )

    _exclude_interfaces(r, config)
    for name in config.reroute_virtual_interfaces:
        r.insert("nat", PREROUTING, 0, "iifname", name, "counter", "return")
    if config.drop_invalid:
        r.add(
            "mangle", PREROUTING, "meta l4proto tcp", "ct state", "invalid", "counter", "jump", DROP
        )
        r.add("mangle", DROP, "counter", "drop")
    r.add(
        "nat",
        INBOUND,
        "meta l4proto tcp",
        "tcp dport",
        config.inbound_tunnel_port,
        "counter",
        "return",
    )
    r.add("nat", REDIRECT, "meta l4proto tcp", "counter", "redirect to", ":" + config.proxy_port)
    r.add(
        "nat",
        IN_REDIRECT,
        "meta l4proto tcp",
        "counter",
        "redirect to",
        ":" + config.inbound_capture_port,
    )
    _inbound(r, config, loop4)
    r.add("nat", OUTPUT, "counter", "jump", OUTPUT_CHAIN)
    for port in config.outbound_ports_exclude:
        r.add("nat", OUTPUT_CHAIN, "tcp dport", port, "counter", "return")
        r.add("nat", OUTPUT_CHAIN, "udp dport", port, "counter", "return")
    r.add("nat", OUTPUT_CHAIN, "oifname", "lo", "ip saddr", PASSTHROUGH_V4, "counter", "return")
    r.add(
        "nat",
        OUTPUT_CHAIN,
        "oifname",
        "lo",
        "ip6 saddr",
        PASSTHROUGH_V6,
        "counter",
        "return",
        v6=True,
    )
    _proxy_owners(r, config, loop4, dns=dns, keep_loopback=keep_loopback)
    _owner_groups(r, config)
    if dns:
        _dns(r, config)
    r.add("nat", OUTPUT_CHAIN, "ip daddr", loop4, "counter", "return")
    r.add("nat", OUTPUT_CHAIN, "ip6 daddr", LOOP6, "counter", "return", v6=True)
    exclude = config.outbound_ip_ranges_exclude
    for ip, v6 in (("ip", False), ("ip6", True)):  # all IPv4 exclusions first
        for cidr in (c for c in exclude if is_ipv4_cidr(c) != v6):
            r.add("nat", OUTPUT_CHAIN, f"{ip} daddr", cidr, "counter", "return", v6=v6)
    for port in config.outbound_ports_include:
        r.add("nat", OUTPUT_CHAIN, "tcp dport", port, "counter", "jump", REDIRECT)
    _outbound_include(r, config, include_v4, include_v6)
    if config.tproxy:
        _tproxy_marks(r, config, loop4)
    return r.rules


def _exclude_interfaces(r: _Rules, config: CaptureConfig) -> None:
    tables: tuple[NftTable, ...] = ("nat", "mangle") if config.tproxy else ("nat",)
    for table in tables:
        for name in config.exclude_interfaces:
            r.add(table, PREROUTING, "iifname", name, "counter", "return")
            r.add(table, OUTPUT, "oifname", name, "counter", "return")


def _inbound(r: _Rules, config: CaptureConfig, loop4: str) -> None:
    include = config.inbound_ports_include
    if not include and not config.inbound_ports_set:
        return
    if config.tproxy:
        _inbound_tproxy(r, config, loop4)
        return
    r.add("nat", PREROUTING, "meta l4proto tcp", "counter", "jump", INBOUND)
    if include == WILDCARD:
        for port in config.inbound_ports_exclude:
            r.add("nat", INBOUND, "meta l4proto tcp", "tcp dport", port, "counter", "return")
        r.add("nat", INBOUND, "meta l4proto tcp", "counter", "jump", IN_REDIRECT)
        return
    for port in include:
        r.add("nat", INBOUND, "meta l4proto tcp", "tcp dport", port, "counter", "jump", IN_REDIRECT)


def _inbound_tproxy(r: _Rules, config: CaptureConfig, loop4: str) -> None:
    mark, port = config.tproxy_mark, ":" + config.inbound_capture_port
    r.add("mangle", DIVERT, "counter", "meta mark set", mark)
    r.add("mangle", DIVERT, "counter", "accept")
    r.add(
        "mangle",
        TPROXY,
        "meta l4proto tcp",
        "ip daddr",
        "!=",
        loop4,
        "tproxy ip to",
        port,
        "meta mark set",
        mark,
        "counter",
        "accept",
    )
    r.add(
        "mangle",
        TPROXY,
        "meta l4proto tcp",
        "ip6 daddr",
        "!=",
        LOOP6,
        "tproxy ip6 to",
        port,
        "meta mark set",
        mark,
        "counter",
        "accept",
        v6=True,
    )
    r.add("mangle", PREROUTING, "meta l4proto tcp", "counter", "jump", INBOUND)
    established = ("ct state", "related,established")
    if config.inbound_ports_include == WILDCARD:
        for excluded in config.inbound_ports_exclude:
            r.add("mangle", INBOUND, "meta l4proto tcp", "tcp dport", excluded, "counter", "return")
        r.add("mangle", INBOUND, "meta l4proto tcp", *established, "counter", "jump", DIVERT)
        r.add("mangle", INBOUND, "meta l4proto tcp", "counter", "jump", TPROXY)
        return
    for included in config.inbound_ports_include:
        r.add(
            "mangle",
            INBOUND,
            "meta l4proto tcp",
            *established,
            "tcp dport",
            included,
            "counter",
            "jump",
            DIVERT,
        )
        r.add(
            "mangle", INBOUND, "meta l4proto tcp", "tcp dport", included, "counter", "jump", TPROXY
        )


def _proxy_owners(
    r: _Rules, config: CaptureConfig, loop4: str, *, dns: bool, keep_loopback: bool
) -> None:
    """The proxy's own traffic is never captured, except its calls back to the app over lo.
    Istio skips port 53 in the self-call rule for UIDs only."""
    tunnel = config.inbound_tunnel_port
    owners = [("skuid", v) for v in config.proxy_uids] + [("skgid", v) for v in config.proxy_gids]
    for key, value in owners:
        ports = "{ 53, " + tunnel + " }" if dns and key == "skuid" else tunnel
        for ip, loop, v6 in (("ip", loop4, False), ("ip6", LOOP6, True)):
            r.add(
                "nat",
                OUTPUT_CHAIN,
                "oifname",
                "lo",
                "meta l4proto tcp",
                f"{ip} daddr",
                "!=",
                loop,
                "tcp dport",
                "!=",
                ports,
                key,
                value,
                "counter",
                "jump",
                IN_REDIRECT,
                v6=v6,
            )
        if not keep_loopback:
            if dns:
                r.add(
                    "nat",
                    OUTPUT_CHAIN,
                    "oifname",
                    "lo",
                    "meta l4proto tcp",
                    "tcp dport",
                    "!=",
                    "53",
                    key,
                    "!=",
                    value,
                    "counter",
                    "return",
                )
            else:
                r.add("nat", OUTPUT_CHAIN, "oifname", "lo", key, "!=", value, "counter", "return")
        r.add("nat", OUTPUT_CHAIN, key, value, "counter", "return")


def _owner_groups(r: _Rules, config: CaptureConfig) -> None:
    if config.owner_groups_include == WILDCARD:
        for group in config.owner_groups_exclude:
            r.add("nat", OUTPUT_CHAIN, "skgid", group, "counter", "return")
        return
    words = [w for group in config.owner_groups_include for w in ("skgid", "!=", group)]
    r.add("nat", OUTPUT_CHAIN, *words, "counter", "return")


def _dns(r: _Rules, config: CaptureConfig) -> None:
    """DNS to the agent's resolver (nat) and conntrack zones that keep its flows apart (raw)."""
    all_dns, v4, v6 = config.capture_all_dns, config.dns_servers_v4, config.dns_servers_v6
    r.add("raw", OUTPUT, "counter", "jump", OUTPUT_DNS)
    if all_dns or v4 or v6:
        r.add("nat", OUTPUT_CHAIN, "counter", "jump", OUTPUT_DNS)
    for proto in ("tcp", "udp"):
        if all_dns:
            lead = ("meta l4proto tcp",) if proto == "tcp" else ()
            r.add(
                "nat",
                OUTPUT_DNS,
                *lead,
                f"{proto} dport",
                "53",
                "counter",
                "redirect",
                "to",
                AGENT_DNS,
            )
            continue
        for server in v4:
            r.add(
                "nat",
                OUTPUT_DNS,
                "ip daddr",
                server + "/32",
                f"{proto} dport",
                "53",
                "counter",
                "redirect",
                "to",
                AGENT_DNS,
            )
        for server in v6:
            r.add(
                "nat",
                OUTPUT_DNS,
                "ip6 daddr",
                server + "/128",
                f"{proto} dport",
                "53",
                "counter",
                "redirect",
                "to",
                AGENT_DNS,
                v6=True,
            )
    owners = [("skuid", v) for v in config.proxy_uids] + [("skgid", v) for v in config.proxy_gids]
    # Conntrack zones of the proxy's DNS: its queries upstream (1), its DNS listener's replies (2).
    zones = (("udp dport", "53", "1"), ("udp sport", AGENT_DNS_PORT, "2"))
    for key, value in owners:
        for match, port, zone in zones:
            r.add(
                "raw",
                OUTPUT_DNS,
                match,
                port,
                "meta",
                key,
                value,
                "counter",
                "ct",
                "zone",
                "set",
                zone,
            )
    if all_dns:
        r.add("raw", PREROUTING, "counter", "jump", INBOUND)
        r.add("raw", OUTPUT_DNS, "udp dport", "53", "counter", "ct", "zone", "set", "2")
        r.add("raw", INBOUND, "udp sport", "53", "counter", "ct", "zone", "set", "1")
        return
    if v4 or v6:
        r.add("raw", PREROUTING, "counter", "jump", INBOUND)
    for ip, servers, bits in (("ip", v4, "/32"), ("ip6", v6, "/128")):
        for server in servers:
            r.add(
                "raw",
                OUTPUT_DNS,
                "udp dport",
                "53",
                f"{ip} daddr",
                server + bits,
                "counter",
                "ct",
                "zone",
                "set",
                "2",
                v6=ip == "ip6",
            )
            r.add(
                "raw",
                INBOUND,
                "udp sport",
                "53",
                f"{ip} saddr",
                server + bits,
                "counter",
                "ct",
                "zone",
                "set",
                "1",
                v6=ip == "ip6",
            )


def _outbound_include(
    r: _Rules, config: CaptureConfig, include_v4: list[Cidr], include_v6: list[Cidr]
) -> None:
    virt = config.reroute_virtual_interfaces
    if config.outbound_ip_ranges_include == WILDCARD:
        # One rule for both families, unlike the iptables mode.
        r.add("nat", OUTPUT_CHAIN, "counter", "jump", REDIRECT)
        for name in virt:
            r.insert("nat", PREROUTING, 0, "iifname", name, "counter", "jump", REDIRECT)
        return
    for ip, cidrs in (("ip", include_v4), ("ip6", include_v6)):
        for cidr in cidrs:
            for name in virt:
                r.insert(
                    "nat",
                    PREROUTING,
                    0,
                    "iifname",
                    name,
                    f"{ip} daddr",
                    cidr,
                    "counter",
                    "jump",
                    REDIRECT,
                    v6=ip == "ip6",
                )
            r.add(
                "nat",
                OUTPUT_CHAIN,
                f"{ip} daddr",
                cidr,
                "counter",
                "jump",
                REDIRECT,
                v6=ip == "ip6",
            )


def _tproxy_marks(r: _Rules, config: CaptureConfig, loop4: str) -> None:
    """TPROXY bookkeeping: keep the mark on the connection, skip proxy-to-app loops."""
    mark = config.tproxy_mark
    r.add("mangle", PREROUTING, "meta l4proto tcp", "mark", mark, "counter", "ct mark set mark")
    r.add("mangle", OUTPUT, "oifname", "lo", "meta l4proto tcp", "mark", mark, "counter", "return")
    owners = [("skuid", v) for v in config.proxy_uids] + [("skgid", v) for v in config.proxy_gids]
    for key, value in owners:
        for ip, loop, v6 in (("ip", loop4, False), ("ip6", LOOP6, True)):
            r.add(
                "mangle",
                OUTPUT,
                "oifname",
                "lo",
                "meta l4proto tcp",
                f"{ip} daddr",
                "!=",
                loop,
                key,
                value,
                "counter",
                "meta mark set",
                OUTBOUND_MARK,
                v6=v6,
            )
    r.add(
        "mangle",
        OUTPUT,
        "meta l4proto tcp",
        "ct",
        "mark",
        mark,
        "counter",
        "meta mark set",
        "ct",
        "mark",
    )
    r.insert("mangle", INBOUND, 0, "meta l4proto tcp", "mark", mark, "counter", "return")
    r.insert(
        "mangle",
        INBOUND,
        1,
        "iifname",
        "lo",
        "meta l4proto tcp",
        "ip saddr",
        PASSTHROUGH_V4,
        "counter",
        "return",
    )
    r.insert(
        "mangle",
        INBOUND,
        1,
        "iifname",
        "lo",
        "meta l4proto tcp",
        "ip6 saddr",
        PASSTHROUGH_V6,
        "counter",
        "return",
        v6=True,
    )
    r.insert(
        "mangle",
        INBOUND,
        2,
        "iifname",
        "lo",
        "meta l4proto tcp",
        "mark",
        "!=",
        OUTBOUND_MARK,
        "counter",
        "return",
    )
