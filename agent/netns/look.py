"""One look into a network namespace: its tables, its addresses and its identity.

Everything the agent reads of a namespace comes from here, from the kernel and without starting
a program: which legacy iptables tables are loaded (`/proc/net/ip_tables_names`,
`ip6_tables_names`: a table appears there only once something used it in that namespace), which
nf_tables tables exist (a netlink dump, what `nft list tables` asks), its addresses (an
RTM_GETADDR dump, what Go's net.InterfaceAddrs reads; the IPv6 ones of a look from
`/proc/net/if_inet6`) and its identity ((st_dev, st_ino) of its `ns/net` file). A fresh pod
sandbox has none of the tables, so the `-save` programs that would only confirm it are skipped.

The netlink requests are written here rather than through pyroute2: every pod start waits for
the look, which takes ~0.3 ms with them where pyroute2's address dump alone takes ~1 ms
(bench/README.md).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Literal

from agent.netns import run_in_netns

Family = Literal[4, 6]
NetnsId = tuple[int, int]
"""(st_dev, st_ino) of a network namespace."""

NETLINK_NETFILTER = 12
NFT_MSG_GETTABLE = (10 << 8) | 1  # NFNL_SUBSYS_NFTABLES, NFT_MSG_GETTABLE
RTM_NEWADDR, RTM_GETADDR = 20, 22
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFTA_TABLE_NAME = 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
NFPROTO: dict[int, Family] = {2: 4, 10: 6}  # NFPROTO_IPV4, NFPROTO_IPV6
ADDRESS_BYTES: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 16}
LEGACY_NAMES: dict[Family, str] = {4: "ip_tables_names", 6: "ip6_tables_names"}
PROC_NET = "/proc/thread-self/net"  # the namespace of the calling thread, not the process


@dataclass(frozen=True)
class NetnsLook:
    """What a namespace holds; tables None where the kernel could not be asked (then read it
    fully with the programs)."""

    legacy_tables: dict[Family, frozenset[str]] | None
    nft_tables: frozenset[tuple[Family, str]] | None
    ipv6_addresses: tuple[str, ...]
    ipv4_addresses: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address of the netns, IPv4 first (the order Istio sees them in)."""
        return self.ipv4_addresses + self.ipv6_addresses

    def tables_absent(self, variant: str, family: Family, tables: tuple[str, ...]) -> bool:
        """True when none of `tables` exists in that iptables variant ("legacy"/"nft")."""
        if variant == "legacy":
            if self.legacy_tables is None:
                return False
            return not self.legacy_tables[family].intersection(tables)
        if self.nft_tables is None:
            return False
        return not any((family, t) in self.nft_tables for t in tables)

    @property
    def legacy_loaded(self) -> bool | None:
        """Any legacy table in either family (None: unknown)."""
        if self.legacy_tables is None:
            return None
        return any(self.legacy_tables.values())


@dataclass(frozen=True)
class InterfaceAddress:
    """One address of an RTM_GETADDR dump: IFA_LOCAL (the interface's own end of a
    point-to-point link) and IFA_ADDRESS (the peer's there, else the same)."""

    local: str | None
    address: str | None


def look(netns_path: str) -> NetnsLook:
    """Look into the namespace at `netns_path` (one short-lived thread inside it)."""
    return run_in_netns(netns_path, look_here)


def look_here() -> NetnsLook:
    """The look of the calling thread's namespace."""
    ipv4 = tuple(_own_addresses(socket.AF_INET))
    return NetnsLook(_legacy_tables(), _nft_tables(), tuple(_ipv6_addresses()), ipv4)


def netns_addresses(netns_path: str) -> set[str]:
    """Every IPv4/IPv6 address (IFA_ADDRESS) of the namespace at `netns_path`."""

    def read() -> set[str]:
        return {a.address for a in address_dump(socket.AF_UNSPEC) if a.address}

    return run_in_netns(netns_path, read)


def local_addresses() -> list[str]:
    """The calling thread's namespace's addresses in the kernel's dump order (IPv4, then IPv6),
    as Go's net.InterfaceAddrs lists them: IFA_LOCAL first."""
    return _own_addresses(socket.AF_UNSPEC)


def _own_addresses(family: int) -> list[str]:
    out: list[str] = []
    for a in address_dump(family):
        own = a.local or a.address
        if own:
            out.append(own)
    return out


def ident(path: str) -> NetnsId | None:
    """(st_dev, st_ino) of the namespace at `path`; None when it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _legacy_tables() -> dict[Family, frozenset[str]] | None:
    out: dict[Family, frozenset[str]] = {}
    for family, name in LEGACY_NAMES.items():
        try:
            with open(f"{PROC_NET}/{name}", encoding="ascii") as f:
                out[family] = frozenset(f.read().split())
        except FileNotFoundError:
            out[family] = frozenset()  # the module is not loaded: no table anywhere
        except OSError:
            return None
    return out


def _ipv6_addresses() -> list[str]:
    """Every IPv6 address of the namespace (if_inet6: 32 hex digits, then index, ...)."""
    try:
        with open(f"{PROC_NET}/if_inet6", encoding="ascii") as f:
            rows = [line.split() for line in f]
    except FileNotFoundError:
        return []  # IPv6 is not compiled in or is off
    return [str(ipaddress.IPv6Address(int(row[0], 16))) for row in rows if row]


def _nft_tables() -> frozenset[tuple[Family, str]] | None:
    """(family, name) of the IPv4/IPv6 nf_tables tables; None when netlink did not answer."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER) as sock:
            sock.settimeout(2.0)
            # nlmsghdr(len, type, flags, seq, pid) + nfgenmsg(family=any, version 0, res_id 0)
            sock.send(
                struct.pack("=IHHII", 20, NFT_MSG_GETTABLE, NLM_F_REQUEST_DUMP, 1, 0)
                + struct.pack("=BBH", 0, 0, 0)
            )
            tables: list[tuple[Family, str]] = []
            for body in _dump(sock, "the table dump"):
                family = body[0]
                name = _attribute(body[4:], NFTA_TABLE_NAME)
                if family in NFPROTO and name is not None:
                    tables.append((NFPROTO[family], name))
            return frozenset(tables)
    except (OSError, ValueError):
        return None


def address_dump(family: int) -> list[InterfaceAddress]:
    """The calling thread's namespace's addresses of `family` (AF_INET, AF_INET6 or AF_UNSPEC
    for both), in the kernel's order."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(2.0)
        # nlmsghdr(len, type, flags, seq, pid) + ifaddrmsg(family, prefixlen, flags, scope, index)
        sock.send(
            struct.pack("=IHHII", 24, RTM_GETADDR, NLM_F_REQUEST_DUMP, 1, 0)
            + struct.pack("=BBBBI", family, 0, 0, 0, 0)
        )
        out: list[InterfaceAddress] = []
        for body in _dump(sock, "the address dump", kind=RTM_NEWADDR, error=OSError):
            got = body[0]
            if got in ADDRESS_BYTES and family in (socket.AF_UNSPEC, got):
                out.append(_interface_address(body[8:], got))
        return out


def _dump(
    sock: socket.socket, what: str, *, kind: int | None = None, error: type[Exception] = ValueError
) -> list[bytes]:
    """The bodies (after the 16-byte header) of a netlink dump's messages, until NLMSG_DONE;
    `kind`: only messages of that type."""
    bodies: list[bytes] = []
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + 16 <= len(data):
            length, got = struct.unpack_from("=IH", data, offset)
            if length < 16:
                raise error("netlink: malformed message")
            if got == NLMSG_DONE:
                return bodies
            if got == NLMSG_ERROR:
                raise error(f"netlink: error reply to {what}")
            if kind is None or got == kind:
                bodies.append(data[offset + 16 : offset + length])
            offset += (length + 3) & ~3


def _interface_address(attrs: bytes, family: int) -> InterfaceAddress:
    """IFA_LOCAL and IFA_ADDRESS of one message, spelled as inet_ntop spells them."""
    size = ADDRESS_BYTES[family]
    found: dict[int, bytes] = {}
    offset = 0
    while offset + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, offset)
        if length < 4:
            break
        if kind in (IFA_ADDRESS, IFA_LOCAL) and length == 4 + size:
            found[kind] = attrs[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    local, address = found.get(IFA_LOCAL), found.get(IFA_ADDRESS)
    return InterfaceAddress(
        None if local is None else socket.inet_ntop(family, local),
        None if address is None else socket.inet_ntop(family, address),
    )


def _attribute(attrs: bytes, wanted: int) -> str | None:
    offset = 0
    while offset + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, offset)
        if length < 4:
            return None
        if kind & 0x3FFF == wanted:
            return attrs[offset + 4 : offset + length].rstrip(b"\0").decode("ascii", "replace")
        offset += (length + 3) & ~3
    return None
