"""The two settings Istio detects rather than reads: is IPv6 on, and which DNS servers.

Istio looks at the local addresses (in the pod's network namespace when run by the plugin):
IPv6 is on when the first non-loopback, non-link-local address is IPv6, or, with dual stack,
when any such address is IPv6. DNS servers are the `nameserver` lines of /etc/resolv.conf.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from pyroute2 import IPRoute


def local_addresses() -> list[str]:
    """Addresses of the calling thread's network namespace, by interface index (as Go lists)."""
    with IPRoute() as ipr:
        dump = ipr.get_addr()
    rows = [(int(msg["index"]), str(msg.get_attr("IFA_ADDRESS") or "")) for msg in dump]
    rows.sort(key=lambda row: row[0])
    return [addr for _, addr in rows if addr]


def ipv6_enabled(addresses: Iterable[str], *, dual_stack: bool) -> bool:
    """Istio's rule: the first usable address decides, or any IPv6 one with dual stack."""
    for text in addresses:
        addr = ipaddress.ip_address(text.split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if addr.is_loopback or addr.is_link_local or (addr.is_multicast and _link_local_mc(addr)):
            continue
        if addr.version == 6:
            return True
        if not dual_stack:
            return False
    return False


def _link_local_mc(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if addr.version == 4:
        return addr in ipaddress.ip_network("224.0.0.0/24")
    return addr in ipaddress.ip_network("ff02::/16")


def resolv_conf_servers(path: str = "/etc/resolv.conf") -> list[str]:
    """`nameserver` addresses of a resolv.conf, in order; a missing file means none."""
    servers: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return servers
    for line in lines:
        words = line.split("#", 1)[0].split(";", 1)[0].split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                ipaddress.ip_address(words[1].split("%")[0])
            except ValueError:
                continue
            servers.append(words[1])
    return servers
