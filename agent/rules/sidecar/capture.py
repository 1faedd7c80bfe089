"""CaptureConfig: every setting that shapes a pod's redirect rules, validated once.

The fields mirror the settings of Istio's `istio-iptables` (names in the docstrings), already
split and checked: ports are decimal strings 0-65535, CIDRs parse, the loopback CIDR is inside
127.0.0.0/8. Values are kept as the user spelled them because Istio prints them verbatim.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from agent import constants
from agent.errors import TokenError
from agent.podinput.tokens import (
    Address,
    Cidr,
    GroupName,
    Id,
    InterfaceName,
    Mark,
    Padded,
    Port,
    Token,
    canonical_cidr,
    core,
)

T = TypeVar("T", bound=Token)
WILDCARD: Literal["*"] = "*"
"""The `*` of Istio's list settings: all ports / all addresses / all groups."""

InterceptionMode = Literal["REDIRECT", "TPROXY"]
Wildcard = Literal["*"]

MAX_OWNER_GROUPS_INCLUDE = 64
"""Istio's limit: included groups become one rule with one owner match per group."""


_PROXY_PORT = Port(constants.PROXY_OUTBOUND_PORT)
_CAPTURE_PORT = Port(constants.PROXY_INBOUND_CAPTURE_PORT)
_TUNNEL_PORT = Port(constants.PROXY_INBOUND_TUNNEL_PORT)
_TPROXY_MARK = Mark(constants.TPROXY_MARK)
_ROUTE_TABLE = Id(constants.TPROXY_ROUTE_TABLE)
_LOOPBACK_V4 = Cidr("127.0.0.1/32")
_PROXY_IDS = (Id(constants.PROXY_ID),)

PortValue = Port | Padded
IdValue = Id | Padded
GroupValue = GroupName | Padded
InterfaceValue = InterfaceName | Padded


@dataclass(frozen=True)
class CaptureConfig:
    """One pod's capture settings (Istio's `istio-iptables` configuration).

    Every value is a token (agent.podinput.tokens); plain text given here is checked and turned
    into one, so a config never holds a value that was not validated.
    """

    proxy_port: Port = _PROXY_PORT
    """ProxyPort: Envoy's outbound listener (ISTIO_REDIRECT target)."""
    inbound_capture_port: Port = _CAPTURE_PORT
    """InboundCapturePort: where inbound TCP is redirected or TPROXYed."""
    inbound_tunnel_port: Port = _TUNNEL_PORT
    """InboundTunnelPort: HBONE port, never captured inbound."""
    proxy_uids: tuple[IdValue, ...] = _PROXY_IDS
    """ProxyUID: UIDs whose traffic is the proxy's own (never captured)."""
    proxy_gids: tuple[IdValue, ...] = _PROXY_IDS
    """ProxyGID: GIDs whose traffic is the proxy's own."""
    interception_mode: InterceptionMode = "REDIRECT"
    """InboundInterceptionMode: REDIRECT (nat) or TPROXY (mangle, keeps the destination)."""
    tproxy_mark: Mark = _TPROXY_MARK
    """InboundTProxyMark: fwmark of TPROXYed packets."""
    tproxy_route_table: Id = _ROUTE_TABLE
    """InboundTProxyRouteTable: policy routing table for TPROXY."""
    inbound_ports_include: tuple[PortValue, ...] | Wildcard = ()
    """InboundPortsInclude: inbound ports to capture; `*` all; empty none."""
    inbound_ports_set: bool = False
    """InboundPortsInclude was given as non-empty text that lists no port (`,`): Istio still
    sets up the inbound chains and the PREROUTING jump, only with no port rule."""
    inbound_ports_exclude: tuple[PortValue, ...] = ()
    """InboundPortsExclude: exemptions when inbound ports is `*`."""
    outbound_ports_include: tuple[PortValue, ...] = ()
    """OutboundPortsInclude: outbound ports always captured."""
    outbound_ports_exclude: tuple[PortValue, ...] = ()
    """OutboundPortsExclude: outbound ports never captured (TCP and UDP)."""
    outbound_ip_ranges_include: tuple[Cidr, ...] | Wildcard = ()
    """OutboundIPRangesInclude: outbound CIDRs to capture; `*` all; empty none."""
    outbound_ip_ranges_exclude: tuple[Cidr, ...] = ()
    """OutboundIPRangesExclude: outbound CIDRs never captured."""
    exclude_interfaces: tuple[InterfaceValue, ...] = ()
    """ExcludeInterfaces: NICs whose traffic is never captured."""
    reroute_virtual_interfaces: tuple[InterfaceValue, ...] = ()
    """RerouteVirtualInterfaces (kubevirt): NICs whose inbound traffic is treated as outbound."""
    redirect_dns: bool = False
    """RedirectDNS: send DNS (port 53) to the agent's DNS proxy (AGENT_DNS_PORT)."""
    capture_all_dns: bool = False
    """CaptureAllDNS: with redirect_dns, all port-53 traffic, not only the listed servers."""
    dns_servers_v4: tuple[Address, ...] = ()
    """DNSServersV4: resolvers whose traffic is captured (as spelled)."""
    dns_servers_v6: tuple[Address, ...] = ()
    """DNSServersV6: IPv6 resolvers whose traffic is captured (as spelled)."""
    drop_invalid: bool = False
    """DropInvalid: drop conntrack-INVALID packets instead of letting them reset."""
    enable_ipv6: bool = False
    """EnableIPv6: also program the IPv6 tables."""
    owner_groups_include: tuple[GroupValue, ...] | Wildcard = WILDCARD
    """OwnerGroupsInclude: groups whose outbound traffic is captured; `*` all."""
    owner_groups_exclude: tuple[GroupValue, ...] = ()
    """OwnerGroupsExclude: groups never captured (only when include is `*`)."""
    host_ipv4_loopback_cidr: Cidr = _LOOPBACK_V4
    """HostIPv4LoopbackCidr: app-to-self loopback range, inside 127.0.0.0/8."""

    def __post_init__(self) -> None:
        for name, (kind, listed) in _FIELD_TOKENS.items():
            value = getattr(self, name)
            if listed:
                if value == WILDCARD and name in _WILDCARD_FIELDS:
                    continue
                if not isinstance(value, tuple):
                    raise TypeError(f"CaptureConfig.{name}: want a tuple, got {value!r}")
                value = tuple(_token(kind, item, padded=True) for item in value)
            else:
                value = _token(kind, value, padded=False)
            object.__setattr__(self, name, value)
        if self.interception_mode not in ("REDIRECT", "TPROXY"):
            raise TypeError(f"CaptureConfig.interception_mode: {self.interception_mode!r}")

    @property
    def tproxy(self) -> bool:
        return self.interception_mode == "TPROXY"


_FIELD_TOKENS: dict[str, tuple[type[Token], bool]] = {
    "proxy_port": (Port, False),
    "inbound_capture_port": (Port, False),
    "inbound_tunnel_port": (Port, False),
    "proxy_uids": (Id, True),
    "proxy_gids": (Id, True),
    "tproxy_mark": (Mark, False),
    "tproxy_route_table": (Id, False),
    "inbound_ports_include": (Port, True),
    "inbound_ports_exclude": (Port, True),
    "outbound_ports_include": (Port, True),
    "outbound_ports_exclude": (Port, True),
    "outbound_ip_ranges_include": (Cidr, True),
    "outbound_ip_ranges_exclude": (Cidr, True),
    "exclude_interfaces": (InterfaceName, True),
    "reroute_virtual_interfaces": (InterfaceName, True),
    "dns_servers_v4": (Address, True),
    "dns_servers_v6": (Address, True),
    "owner_groups_include": (GroupName, True),
    "owner_groups_exclude": (GroupName, True),
    "host_ipv4_loopback_cidr": (Cidr, False),
}
"""Each token field of CaptureConfig: its kind, and whether it is a tuple of them."""
_WILDCARD_FIELDS = frozenset(
    {"inbound_ports_include", "outbound_ip_ranges_include", "owner_groups_include"}
)


def _token(kind: type[Token], value: object, *, padded: bool) -> Token | Padded:
    """`value` as a token of `kind` (a list item may keep spaces around it, as spelled)."""
    if isinstance(value, Padded) and padded and isinstance(value.token, kind):
        return value
    if isinstance(value, kind):
        return value
    if isinstance(value, str) and padded:
        return Padded.spelled(kind, str(value))
    return kind(value)


# --- parsing helpers shared by the flag parser and the pod annotations -----------------------


def split_list(value: str) -> list[str]:
    """Istio's list split: on commas, empty items dropped, items not trimmed."""
    return [item for item in value.split(",") if item]


def parse_ports(value: str, *, allow_wildcard: bool) -> tuple[Port | Padded, ...] | Wildcard:
    """Comma list of ports 0-65535; `*` when allowed.

    Items keep the spaces written around them, repeats included: Istio writes each item into
    its rules verbatim (iptables-restore splits on the spaces), one rule per item.
    """
    if value.strip() == WILDCARD:
        if not allow_wildcard:
            raise ValueError("'*' is not allowed here")
        return WILDCARD
    return tuple(_spelled(Port, item) for item in split_list(value))


def _spelled(kind: type[T], item: str) -> T | Padded:
    try:
        return Padded.spelled(kind, item)  # type: ignore[return-value]  # a token of `kind`
    except TokenError as e:
        raise ValueError(str(e)) from None


def parse_port(value: str) -> Port:
    ports = parse_ports(value, allow_wildcard=False)
    if ports == WILDCARD or len(ports) != 1:
        raise ValueError(f"expected one port, got {value!r}")
    return Port(core(ports[0]))


def parse_cidrs(value: str, *, allow_wildcard: bool) -> tuple[Cidr, ...] | Wildcard:
    """Comma list of CIDRs (address/prefix) printed as Go's netip.Prefix would."""
    if value == WILDCARD:
        if not allow_wildcard:
            raise ValueError("'*' is not allowed here")
        return WILDCARD
    return tuple(canonical_cidr(item) for item in split_list(value))


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


def parse_ids(value: str) -> tuple[Id | Padded, ...]:
    """Comma list of numeric UIDs/GIDs, kept as spelled (spaces around an id are Istio's too)."""
    return tuple(_spelled(Id, item) for item in split_list(value))


def parse_groups(value: str) -> tuple[GroupName | Padded, ...]:
    """Comma list of group names or GIDs (iptables resolves names)."""
    return tuple(_spelled(GroupName, item) for item in split_list(value))


def parse_interfaces(value: str) -> tuple[InterfaceName | Padded, ...]:
    """Comma list of interface names (agent.podinput.tokens.InterfaceName), kept as spelled:
    Istio writes `-i  eth1` for `eth0, eth1` and iptables-restore reads it as eth1."""
    return tuple(_spelled(InterfaceName, item) for item in split_list(value) if item.strip())


def parse_mark(value: str) -> Mark:
    if not value.isdigit() or not value.isascii() or int(value) > 0xFFFFFFFF:
        raise ValueError(f"{value!r} is not a 32-bit decimal mark")
    return Mark(value)


def parse_route_table(value: str) -> Id:
    if not value.isdigit() or not value.isascii() or not 0 < int(value) < 0xFFFFFFFF:
        raise ValueError(f"{value!r} is not a routing table number")
    return Id(value)


def parse_interception_mode(value: str) -> InterceptionMode:
    """REDIRECT or TPROXY; empty means REDIRECT (Istio's default)."""
    if value in ("", "REDIRECT"):
        return "REDIRECT"
    if value == "TPROXY":
        return "TPROXY"
    raise ValueError(f"unknown interception mode {value!r} (want REDIRECT or TPROXY)")


def parse_loopback_cidr(value: str) -> Cidr:
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
    return _spelled(Cidr, value)  # type: ignore[return-value]  # no spaces: it parsed


def split_dns_servers(
    servers: Sequence[str],
) -> tuple[tuple[Address, ...], tuple[Address, ...]]:
    """IPv4 and IPv6 resolvers, each kept as spelled."""
    v4: list[Address] = []
    v6: list[Address] = []
    for server in servers:
        try:
            addr = ipaddress.ip_address(server)
        except ValueError:
            raise ValueError(f"DNS server {server!r} is not an IP address") from None
        (v4 if addr.version == 4 else v6).append(Address(server))
    return tuple(v4), tuple(v6)
