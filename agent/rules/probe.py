"""One cheap look into a network namespace before its rules are applied.

The kernel tells, per namespace and without starting a program: which legacy iptables tables are
loaded (`/proc/net/ip_tables_names`, `ip6_tables_names`: a table appears there only once
something used it in that namespace), which nf_tables tables exist (a netlink dump, what
`nft list tables` asks) and which IPv6 addresses are configured (`/proc/net/if_inet6`). A fresh
pod sandbox has none of the tables, so the `-save` programs that would only confirm it are
skipped; when a table is there, callers read it with the programs as before.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

from agent.netns import run_in_netns
from agent.rules.model import Family

NETLINK_NETFILTER = 12
NFT_MSG_GETTABLE = (10 << 8) | 1  # NFNL_SUBSYS_NFTABLES, NFT_MSG_GETTABLE
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFTA_TABLE_NAME = 1
NFPROTO: dict[int, Family] = {2: 4, 10: 6}  # NFPROTO_IPV4, NFPROTO_IPV6
LEGACY_NAMES: dict[Family, str] = {4: "ip_tables_names", 6: "ip6_tables_names"}
PROC_NET = "/proc/thread-self/net"  # the namespace of the calling thread, not the process


@dataclass(frozen=True)
class NetnsProbe:
    """What a namespace holds; None where the kernel could not be asked (then read it fully)."""

    legacy_tables: dict[Family, frozenset[str]] | None
    nft_tables: frozenset[tuple[Family, str]] | None
    ipv6_addresses: tuple[str, ...]

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


def probe(netns_path: str) -> NetnsProbe:
    """Look into the namespace at `netns_path` (one short-lived thread inside it)."""
    return run_in_netns(netns_path, probe_here)


def probe_here() -> NetnsProbe:
    """The probe of the calling thread's namespace."""
    return NetnsProbe(_legacy_tables(), _nft_tables(), tuple(_ipv6_addresses()))


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
            return frozenset(_read_tables(sock))
    except (OSError, ValueError):
        return None


def _read_tables(sock: socket.socket) -> list[tuple[Family, str]]:
    tables: list[tuple[Family, str]] = []
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if length < 16:
                raise ValueError("netlink: malformed message")
            if kind == NLMSG_DONE:
                return tables
            if kind == NLMSG_ERROR:
                raise ValueError("netlink: error reply to the table dump")
            family = data[offset + 16]
            name = _attribute(data[offset + 20 : offset + length], NFTA_TABLE_NAME)
            if family in NFPROTO and name is not None:
                tables.append((NFPROTO[family], name))
            offset += (length + 3) & ~3


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
