"""CaptureConfig: every setting that shapes a pod's redirect rules, validated once.

The fields mirror the settings of Istio's `istio-iptables` (names in the docstrings), already
split and checked: ports are decimal strings 0-65535, CIDRs parse, the loopback CIDR is inside
127.0.0.0/8. Values are kept as the user spelled them because Istio prints them verbatim.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agent import constants

WILDCARD: Literal["*"] = "*"
"""The `*` of Istio's list settings: all ports / all addresses / all groups."""

InterceptionMode = Literal["REDIRECT", "TPROXY"]
Wildcard = Literal["*"]

MAX_OWNER_GROUPS_INCLUDE = 64
"""Istio's limit: included groups become one rule with one owner match per group."""


@dataclass(frozen=True)
class CaptureConfig:
    """One pod's capture settings (Istio's `istio-iptables` configuration)."""

    proxy_port: str = constants.PROXY_OUTBOUND_PORT
    """ProxyPort: Envoy's outbound listener (ISTIO_REDIRECT target)."""
    inbound_capture_port: str = constants.PROXY_INBOUND_CAPTURE_PORT
    """InboundCapturePort: where inbound TCP is redirected or TPROXYed."""
    inbound_tunnel_port: str = constants.PROXY_INBOUND_TUNNEL_PORT
    """InboundTunnelPort: HBONE port, never captured inbound."""
    proxy_uids: tuple[str, ...] = (constants.PROXY_ID,)
    """ProxyUID: UIDs whose traffic is the proxy's own (never captured)."""
    proxy_gids: tuple[str, ...] = (constants.PROXY_ID,)
    """ProxyGID: GIDs whose traffic is the proxy's own."""
    interception_mode: InterceptionMode = "REDIRECT"
    """InboundInterceptionMode: REDIRECT (nat) or TPROXY (mangle, keeps the destination)."""
    tproxy_mark: str = constants.TPROXY_MARK
    """InboundTProxyMark: fwmark of TPROXYed packets."""
    tproxy_route_table: str = constants.TPROXY_ROUTE_TABLE
    """InboundTProxyRouteTable: policy routing table for TPROXY."""
    inbound_ports_include: tuple[str, ...] | Wildcard = ()
    """InboundPortsInclude: inbound ports to capture; `*` all; empty none."""
    inbound_ports_set: bool = False
    """InboundPortsInclude was given as non-empty text that lists no port (`,`): Istio still
    sets up the inbound chains and the PREROUTING jump, only with no port rule."""
    inbound_ports_exclude: tuple[str, ...] = ()
    """InboundPortsExclude: exemptions when inbound ports is `*`."""
    outbound_ports_include: tuple[str, ...] = ()
    """OutboundPortsInclude: outbound ports always captured."""
    outbound_ports_exclude: tuple[str, ...] = ()
    """OutboundPortsExclude: outbound ports never captured (TCP and UDP)."""
    outbound_ip_ranges_include: tuple[str, ...] | Wildcard = ()
    """OutboundIPRangesInclude: outbound CIDRs to capture; `*` all; empty none."""
    outbound_ip_ranges_exclude: tuple[str, ...] = ()
    """OutboundIPRangesExclude: outbound CIDRs never captured."""
    exclude_interfaces: tuple[str, ...] = ()
    """ExcludeInterfaces: NICs whose traffic is never captured."""
    reroute_virtual_interfaces: tuple[str, ...] = ()
    """RerouteVirtualInterfaces (kubevirt): NICs whose inbound traffic is treated as outbound."""
    redirect_dns: bool = False
    """RedirectDNS: send DNS (port 53) to the agent's DNS proxy (AGENT_DNS_PORT)."""
    capture_all_dns: bool = False
    """CaptureAllDNS: with redirect_dns, all port-53 traffic, not only the listed servers."""
    dns_servers_v4: tuple[str, ...] = ()
    """DNSServersV4: resolvers whose traffic is captured (as spelled)."""
    dns_servers_v6: tuple[str, ...] = ()
    """DNSServersV6: IPv6 resolvers whose traffic is captured (as spelled)."""
    drop_invalid: bool = False
    """DropInvalid: drop conntrack-INVALID packets instead of letting them reset."""
    enable_ipv6: bool = False
    """EnableIPv6: also program the IPv6 tables."""
    owner_groups_include: tuple[str, ...] | Wildcard = WILDCARD
    """OwnerGroupsInclude: groups whose outbound traffic is captured; `*` all."""
    owner_groups_exclude: tuple[str, ...] = ()
    """OwnerGroupsExclude: groups never captured (only when include is `*`)."""
    host_ipv4_loopback_cidr: str = "127.0.0.1/32"
    """HostIPv4LoopbackCidr: app-to-self loopback range, inside 127.0.0.0/8."""

    @property
    def tproxy(self) -> bool:
        return self.interception_mode == "TPROXY"


# --- parsing helpers shared by the flag parser and the pod annotations -----------------------


def split_list(value: str) -> list[str]:
    """Istio's list split: on commas, empty items dropped, items not trimmed."""
    return [item for item in value.split(",") if item]


def parse_ports(value: str, *, allow_wildcard: bool) -> tuple[str, ...] | Wildcard:
    """Comma list of ports 0-65535; `*` when allowed.

    Items are kept as spelled, spaces and repeats included: Istio writes each item into its
    rules verbatim (iptables-restore splits on the spaces), one rule per item.
    """
    if value.strip() == WILDCARD:
        if not allow_wildcard:
            raise ValueError("'*' is not allowed here")
        return WILDCARD
    ports: list[str] = []
    for item in split_list(value):
        port = item.strip()
        if not port.isdigit() or not port.isascii():
            raise ValueError(f"port {item!r} is not a number")
        if int(port) > 65535:
            raise ValueError(f"port {port} is out of range 0-65535")
        ports.append(item)
    return tuple(ports)


def parse_port(value: str) -> str:
    ports = parse_ports(value, allow_wildcard=False)
    if len(ports) != 1:
        raise ValueError(f"expected one port, got {value!r}")
    return ports[0].strip()


def parse_cidrs(value: str, *, allow_wildcard: bool) -> tuple[str, ...] | Wildcard:
    """Comma list of CIDRs (address/prefix) printed as Go's netip.Prefix would."""
    if value == WILDCARD:
        if not allow_wildcard:
            raise ValueError("'*' is not allowed here")
        return WILDCARD
    return tuple(canonical_cidr(item) for item in split_list(value))


def canonical_cidr(item: str) -> str:
    """The CIDR as Go's netip.Prefix prints it (host bits kept, IPv4-mapped as ::ffff:a.b.c.d)."""
    if "/" not in item:
        raise ValueError(f"{item!r} is not a CIDR (address/prefix-length)")
    if "%" in item:
        raise ValueError(f"{item!r}: zones are not allowed in a CIDR")
    try:
        net = ipaddress.ip_interface(item)
    except ValueError as e:
        raise ValueError(f"{item!r} is not a valid CIDR: {e}") from None
    return f"{go_addr(net.ip)}/{net.network.prefixlen}"


def go_addr(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as Go's netip.Addr.String() writes it: IPv4-mapped IPv6 keeps its dotted
    IPv4 tail (Python before 3.13 prints it as hex groups)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        scope = f"%{addr.scope_id}" if addr.scope_id else ""
        return f"::ffff:{addr.ipv4_mapped}{scope}"
    return str(addr)


def unmap(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Go's Addr.Unmap: an IPv4-mapped IPv6 address as the IPv4 address it carries."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_ipv4_cidr(cidr: str) -> bool:
    return ipaddress.ip_interface(cidr).version == 4


def cidr_is_loopback(cidr: str) -> bool:
    """Go's IsLoopback, which sees through IPv4-mapped IPv6 (`::ffff:127.0.0.1/128`)."""
    return unmap(ipaddress.ip_interface(cidr).ip).is_loopback


def parse_ids(value: str) -> tuple[str, ...]:
    """Comma list of numeric UIDs/GIDs, kept as spelled (spaces around an id are Istio's too)."""
    ids = split_list(value)
    for item in ids:
        number = item.strip()
        if not number.isdigit() or not number.isascii() or int(number) > 0xFFFFFFFF:
            raise ValueError(f"{item!r} is not a numeric user/group id")
    return tuple(ids)


def parse_groups(value: str) -> tuple[str, ...]:
    """Comma list of group names or GIDs (iptables resolves names)."""
    groups = split_list(value)
    for item in groups:
        name = item.strip()
        if not name or any(c.isspace() or c in ",:!" for c in name):
            raise ValueError(f"{item!r} is not a group name or id")
    return tuple(groups)


def parse_interfaces(value: str) -> tuple[str, ...]:
    """Comma list of Linux interface names (at most 15 bytes, no '/', ':' or spaces), kept as
    spelled: Istio writes `-i  eth1` for `eth0, eth1` and iptables-restore reads it as eth1."""
    names = [item for item in split_list(value) if item.strip()]
    for item in names:
        name = item.strip()
        if (
            len(name.encode()) > 15
            or name in (".", "..")
            or any(c.isspace() or c in "/:" for c in name)
        ):
            raise ValueError(f"{name!r} is not a valid interface name")
    return tuple(names)


def parse_mark(value: str) -> str:
    if not value.isdigit() or not value.isascii() or int(value) > 0xFFFFFFFF:
        raise ValueError(f"{value!r} is not a 32-bit decimal mark")
    return value


def parse_route_table(value: str) -> str:
    if not value.isdigit() or not value.isascii() or not 0 < int(value) < 0xFFFFFFFF:
        raise ValueError(f"{value!r} is not a routing table number")
    return value


def parse_interception_mode(value: str) -> InterceptionMode:
    """REDIRECT or TPROXY; empty means REDIRECT (Istio's default)."""
    if value in ("", "REDIRECT"):
        return "REDIRECT"
    if value == "TPROXY":
        return "TPROXY"
    raise ValueError(f"unknown interception mode {value!r} (want REDIRECT or TPROXY)")


def parse_loopback_cidr(value: str) -> str:
    """Istio's check: an IPv4 loopback address with a mask of 8 to 32 bits."""
    try:
        net = ipaddress.ip_interface(value)
    except ValueError as e:
        raise ValueError(f"{value!r} is not a valid CIDR: {e}") from None
    if "/" not in value:
        raise ValueError(f"{value!r} is not a CIDR (address/prefix-length)")
    if net.version != 4 or not net.ip.is_loopback:
        raise ValueError(f"{value!r} is not an IPv4 loopback CIDR (inside 127.0.0.0/8)")
    if not 8 <= net.network.prefixlen <= 32:
        raise ValueError(f"{value!r} must have a mask of 8 to 32 bits")
    return value


def split_dns_servers(servers: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """IPv4 and IPv6 resolvers, each kept as spelled."""
    v4: list[str] = []
    v6: list[str] = []
    for server in servers:
        try:
            addr = ipaddress.ip_address(server)
        except ValueError:
            raise ValueError(f"DNS server {server!r} is not an IP address") from None
        (v4 if addr.version == 4 else v6).append(server)
    return tuple(v4), tuple(v6)
