"""The two settings Istio detects rather than reads: is IPv6 on, and which DNS servers.

Istio looks at the local addresses (in the pod's network namespace when run by the plugin) in
the kernel's dump order (all IPv4 addresses, then all IPv6; not grouped by interface): IPv6 is on
when the first non-loopback, non-link-local address is IPv6, or, with dual stack, when any such
address is IPv6; with no such address at all istio-iptables fails. DNS servers are the
`nameserver` lines of /etc/resolv.conf, read as Go's miekg/dns reads them (whitespace-separated
words, no comment stripping, so `nameserver 10.0.0.1#x` names no server) and printed normalised.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from agent.podinput.tokens import go_addr


def detect_ipv6(addresses: Iterable[str], *, dual_stack: bool) -> bool:
    """istio-iptables' detection: as ipv6_enabled, but no usable address is an error."""
    usable = [a for a in addresses if not _skipped(_unmapped(a))]
    if not usable:
        raise ValueError("no valid local IP address found: IPv6 cannot be decided")
    return ipv6_enabled(usable, dual_stack=dual_stack)


def ipv6_enabled(addresses: Iterable[str], *, dual_stack: bool) -> bool:
    """Istio's rule: the first usable address decides, or any IPv6 one with dual stack."""
    for text in addresses:
        addr = _unmapped(text)
        if _skipped(addr):
            continue
        if addr.version == 6:
            return True
        if not dual_stack:
            return False
    return False


def _unmapped(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    addr = ipaddress.ip_address(text.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _skipped(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return addr.is_loopback or addr.is_link_local or (addr.is_multicast and _link_local_mc(addr))


def _link_local_mc(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if addr.version == 4:
        return addr in ipaddress.ip_network("224.0.0.0/24")
    return addr in ipaddress.ip_network("ff02::/16")


def resolv_conf_servers(path: str = "/etc/resolv.conf") -> list[str]:
    """`nameserver` addresses of a resolv.conf, in order, as Go prints them; a missing file
    means none."""
    servers: list[str] = []
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return servers
    for line in text.split("\n"):
        words = _GO_SPACE.split(line.strip(_GO_SPACE_CHARS))
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                addr = ipaddress.ip_address(words[1])
            except ValueError:
                continue  # Istio drops what netip.ParseAddr rejects, comments glued on included
            servers.append(go_addr(addr))
    return servers


# Go's unicode.IsSpace (strings.Fields): Python's str.split() also splits on \x1c-\x1f.
_GO_SPACE_CHARS = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_GO_SPACE = re.compile(f"[{_GO_SPACE_CHARS}]+")
