"""Istio's native nftables rules for a CaptureConfig (sidecar mode, `--native-nftables`).

Istio's nftables mode is not a translation of its iptables rules: it writes its own rules into
three `inet` tables (`istio-proxy-nat`, `-mangle`, `-raw`) with lower-case chains, in its own
order, and some steps differ from the iptables ones (one wildcard jump for both families, DNS
zone rules in another order, inserts by nftables index). `RULES` holds Istio's rules, one a line
(`table chain expression`, values as the user spelled them filled into the `{slots}`); each step
below adds them in Istio's sequence. `render_native` prints the commands Istio's transaction
prints (agent.rules.nft).
"""

from __future__ import annotations

from typing import Final

from agent import constants
from agent.podinput.tokens import Cidr
from agent.rules import nft
from agent.rules.nft import OUTPUT, PREROUTING, NftRule, NftRules, NftTable
from agent.rules.sidecar.capture import WILDCARD, CaptureConfig, cidr_is_loopback, is_ipv4_cidr
from agent.rules.sidecar.nft_rules import RULES

INBOUND, OUTPUT_CHAIN, OUTPUT_DNS = "istio-inbound", "istio-output", "istio-output-dns"
REDIRECT, IN_REDIRECT = "istio-redirect", "istio-in-redirect"
DIVERT, TPROXY, DROP = "istio-divert", "istio-tproxy", "istio-drop"

CHAINS: dict[NftTable, tuple[str, ...]] = {
    "nat": (PREROUTING, OUTPUT, INBOUND, REDIRECT, IN_REDIRECT, OUTPUT_CHAIN, OUTPUT_DNS),
    "mangle": (PREROUTING, OUTPUT, DIVERT, TPROXY, INBOUND, DROP),
    "raw": (PREROUTING, OUTPUT, INBOUND, OUTPUT_DNS),
}
"""Each table's chains in the order Istio declares them (only those with rules are created)."""

CONSTANTS: Final = {
    "agent_dns_port": constants.AGENT_DNS_PORT,
    "outbound_mark": constants.OUTBOUND_MARK,
    "passthrough_v4": constants.INBOUND_PASSTHROUGH_V4,
    "passthrough_v6": constants.INBOUND_PASSTHROUGH_V6,
    "loop6": constants.LOOPBACK_V6,
}


def build_native(config: CaptureConfig) -> list[NftRule]:
    """Istio's rules for `config`, in the order its nftables configurator adds them."""
    r = NftRules(RULES, ipv6=config.enable_ipv6, values=CONSTANTS)
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
        r.insert("virtual-return", 0, name=name)
    if config.drop_invalid:
        r.add("drop-invalid")
        r.add("drop")
    r.add("tunnel-return", port=config.inbound_tunnel_port)
    r.add("redirect", port=config.proxy_port)
    r.add("in-redirect", port=config.inbound_capture_port)
    _inbound(r, config, loop4)
    r.add("output-jump")
    for port in config.outbound_ports_exclude:
        r.add("port-except-tcp", port=port)
        r.add("port-except-udp", port=port)
    r.add("passthrough")
    r.add("passthrough-v6", v6=True)
    _proxy_owners(r, config, loop4, dns=dns, keep_loopback=keep_loopback)
    _owner_groups(r, config)
    if dns:
        _dns(r, config)
    r.add("loopback", loop4=loop4)
    r.add("loopback-v6", v6=True)
    for ip, v6 in (("ip", False), ("ip6", True)):  # all IPv4 exclusions first
        for cidr in (c for c in config.outbound_ip_ranges_exclude if is_ipv4_cidr(c) != v6):
            r.add("cidr-except", v6=v6, ip=ip, cidr=cidr)
    for port in config.outbound_ports_include:
        r.add("port-include", port=port)
    _outbound_include(r, config, include_v4, include_v6)
    if config.tproxy:
        _tproxy_marks(r, config, loop4)
    return r.rules


def render_native(config: CaptureConfig) -> str:
    """Istio's native nftables commands for a sidecar's capture config."""
    return nft.commands(
        build_native(config), prefix=nft.SIDECAR_PREFIX, chains=CHAINS, jumped_to=False
    )


def native_cleanup() -> str:
    """Istio's `--cleanup-only` in native mode: each table declared, then deleted."""
    return nft.cleanup(nft.SIDECAR_PREFIX)


def _owners(config: CaptureConfig) -> list[tuple[str, str]]:
    """The proxy's UIDs then GIDs, as nft matches them."""
    uids: list[tuple[str, str]] = [("skuid", v) for v in config.proxy_uids]
    return uids + [("skgid", v) for v in config.proxy_gids]


def _exclude_interfaces(r: NftRules, config: CaptureConfig) -> None:
    for table in ("nat", "mangle") if config.tproxy else ("nat",):
        for name in config.exclude_interfaces:
            r.add("exclude-in", table=table, name=name)
            r.add("exclude-out", table=table, name=name)


def _inbound(r: NftRules, config: CaptureConfig, loop4: str) -> None:
    include = config.inbound_ports_include
    if not include and not config.inbound_ports_set:
        return
    if config.tproxy:
        _inbound_tproxy(r, config, loop4)
        return
    r.add("inbound-jump")
    if include == WILDCARD:
        for port in config.inbound_ports_exclude:
            r.add("inbound-except", port=port)
        r.add("inbound-all")
        return
    for port in include:
        r.add("inbound-port", port=port)


def _inbound_tproxy(r: NftRules, config: CaptureConfig, loop4: str) -> None:
    mark, port = config.tproxy_mark, config.inbound_capture_port
    r.add("divert-mark", mark=mark)
    r.add("divert-accept")
    r.add("tproxy", loop4=loop4, port=port, mark=mark)
    r.add("tproxy-v6", v6=True, port=port, mark=mark)
    r.add("tproxy-jump")
    if config.inbound_ports_include == WILDCARD:
        for excluded in config.inbound_ports_exclude:
            r.add("tproxy-except", port=excluded)
        r.add("tproxy-divert-all")
        r.add("tproxy-all")
        return
    for included in config.inbound_ports_include:
        r.add("tproxy-divert-port", port=included)
        r.add("tproxy-port", port=included)


def _proxy_owners(
    r: NftRules, config: CaptureConfig, loop4: str, *, dns: bool, keep_loopback: bool
) -> None:
    """The proxy's own traffic is never captured, except its calls back to the app over lo.
    Istio skips port 53 in the self-call rule for UIDs only."""
    tunnel = config.inbound_tunnel_port
    for key, value in _owners(config):
        ports = "{ 53, " + tunnel + " }" if dns and key == "skuid" else tunnel
        for ip, loop, v6 in (("ip", loop4, False), ("ip6", constants.LOOPBACK_V6, True)):
            r.add("owner-self-call", v6=v6, ip=ip, loop=loop, ports=ports, key=key, value=value)
        if not keep_loopback:
            r.add("owner-lo-dns" if dns else "owner-lo", key=key, value=value)
        r.add("owner", key=key, value=value)


def _owner_groups(r: NftRules, config: CaptureConfig) -> None:
    if config.owner_groups_include == WILDCARD:
        for group in config.owner_groups_exclude:
            r.add("group-except", group=group)
        return
    r.add("groups-only", not_groups="".join(f"skgid != {g} " for g in config.owner_groups_include))


def _dns(r: NftRules, config: CaptureConfig) -> None:
    all_dns, v4, v6 = config.capture_all_dns, config.dns_servers_v4, config.dns_servers_v6
    r.add("dns-jump-raw")
    if all_dns or v4 or v6:
        r.add("dns-jump")
    for proto in ("tcp", "udp"):
        if all_dns:
            r.add(f"dns-all-{proto}")
            continue
        for server in v4:
            r.add("dns-server", server=server, proto=proto)
        for server in v6:
            r.add("dns-server-v6", v6=True, server=server, proto=proto)
    # Conntrack zones of the proxy's DNS: its queries upstream (1), its DNS listener's replies (2).
    for key, value in _owners(config):
        r.add("zone-upstream", key=key, value=value)
        r.add("zone-listener", key=key, value=value)
    if all_dns:
        r.add("zone-jump")
        r.add("zone-all-out")
        r.add("zone-all-in")
        return
    if v4 or v6:
        r.add("zone-jump")
    for ip, servers, bits in (("ip", v4, "/32"), ("ip6", v6, "/128")):
        for server in servers:
            r.add("zone-server-out", v6=ip == "ip6", ip=ip, server=server, bits=bits)
            r.add("zone-server-in", v6=ip == "ip6", ip=ip, server=server, bits=bits)


def _outbound_include(
    r: NftRules, config: CaptureConfig, include_v4: list[Cidr], include_v6: list[Cidr]
) -> None:
    virt = config.reroute_virtual_interfaces
    if config.outbound_ip_ranges_include == WILDCARD:
        r.add("all-outbound")  # one rule for both families, unlike the iptables mode
        for name in virt:
            r.insert("virtual-all", 0, name=name)
        return
    for ip, cidrs in (("ip", include_v4), ("ip6", include_v6)):
        for cidr in cidrs:
            for name in virt:
                r.insert("virtual-cidr", 0, v6=ip == "ip6", name=name, ip=ip, cidr=cidr)
            r.add("cidr-include", v6=ip == "ip6", ip=ip, cidr=cidr)


def _tproxy_marks(r: NftRules, config: CaptureConfig, loop4: str) -> None:
    mark = config.tproxy_mark
    r.add("mark-keep", mark=mark)
    r.add("mark-lo-return", mark=mark)
    for key, value in _owners(config):
        for ip, loop, v6 in (("ip", loop4, False), ("ip6", constants.LOOPBACK_V6, True)):
            r.add("mark-owner", v6=v6, ip=ip, loop=loop, key=key, value=value)
    r.add("mark-restore", mark=mark)
    r.insert("marked-return", 0, mark=mark)
    r.insert("lo-passthrough", 1)
    r.insert("lo-passthrough-v6", 1, v6=True)
    r.insert("lo-unmarked", 2)
