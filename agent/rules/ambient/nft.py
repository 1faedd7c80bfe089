"""Ambient mode's rules in Istio's native nftables form (cni/pkg/nftables).

Istio's nftables mode for ambient is not a translation of its iptables rules: in a pod it writes
three `inet` tables (`istio-ambient-nat`, `-mangle`, `-raw`) with lower-case chains, and on the
node one `inet istio-ambient-nat` table whose `postrouting` chain SNATs kubelet's probes, matched
by kubelet's UID (`meta skuid`; nftables has no `--socket-exists`), to enrolled pod IPs kept in
nft sets of that same table (`istio-inpod-probes-v4`/`-v6`, each element's comment the pod UID).
Each step below is one of Istio's, in Istio's order; an expression is Istio's words joined by one
space each, so its spacing quirks (`mark and 0xfff  != 0x539`) are kept as Istio prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from agent import constants
from agent.ambient.dataplane import PodRuleOptions
from agent.podinput.tokens import Address, Id
from agent.rules.ambient.builder import PROBE_IPSET_V4, PROBE_IPSET_V6, redirect_dns
from agent.rules.model import check_nft_rule

AmbientTable = Literal["nat", "mangle", "raw"]
TABLE_ORDER: tuple[AmbientTable, ...] = ("nat", "mangle", "raw")
TABLE_PREFIX = "istio-ambient-"
HOST_TABLE = f"inet {TABLE_PREFIX}nat"
SET_COMMENT = "UUID of the pods that are part of ambient mesh"

PREROUTING, OUTPUT, POSTROUTING = "prerouting", "output", "postrouting"
ISTIO_PREROUTING, ISTIO_OUTPUT = "istio-prerouting", "istio-output"
CHAINS = (PREROUTING, OUTPUT, POSTROUTING, ISTIO_PREROUTING, ISTIO_OUTPUT)
"""Chains in the order Istio declares them (only those with rules or jumps are created)."""

BASE_CHAINS: dict[tuple[AmbientTable, str], str] = {
    ("nat", PREROUTING): "type nat hook prerouting priority -100 ;",
    ("nat", OUTPUT): "type nat hook output priority -100 ;",
    ("nat", POSTROUTING): "type nat hook postrouting priority 100 ;",
    ("mangle", PREROUTING): "type filter hook prerouting priority -150 ;",
    ("mangle", OUTPUT): "type route hook output priority -150 ;",
    ("raw", PREROUTING): "type filter hook prerouting priority -300 ;",
    ("raw", OUTPUT): "type filter hook output priority -300 ;",
}
"""Base chains at Istio's priorities (dstnat, srcnat, mangle, raw), as numbers as knftables
writes them."""

INPOD_MARK = "0x539"
INPOD_MASK = "0xfff"
TPROXY_MARK = "0x111"
TPROXY_MASK = "0xfff"
LOOP4, LOOP6 = "127.0.0.1/32", "::1/128"


@dataclass(frozen=True)
class NftRule:
    table: AmbientTable
    chain: str
    expr: str

    def __post_init__(self) -> None:
        check_nft_rule(self.chain, self.expr)


@dataclass
class _Rules:
    ipv6: bool
    rules: list[NftRule] = field(default_factory=list)

    def add(self, table: AmbientTable, chain: str, *words: str, v6: bool = False) -> None:
        if not v6 or self.ipv6:
            self.rules.append(NftRule(table, chain, " ".join(words)))


def pod_rules(options: PodRuleOptions) -> list[NftRule]:
    """Istio's in-pod rules (AppendInpodRules) for these options, in its order."""
    r = _Rules(ipv6=options.ipv6)
    dns = redirect_dns(options)
    r.add("mangle", PREROUTING, "jump", ISTIO_PREROUTING)
    r.add("mangle", OUTPUT, "jump", ISTIO_OUTPUT)
    r.add("nat", OUTPUT, "jump", ISTIO_OUTPUT)
    if dns:
        r.add("raw", PREROUTING, "jump", ISTIO_PREROUTING)
        r.add("raw", OUTPUT, "jump", ISTIO_OUTPUT)
    r.add("nat", PREROUTING, "jump", ISTIO_PREROUTING)
    # Virtual interfaces first: their inbound is outbound, straight to ztunnel (TCP only).
    for iface in options.virtual_interfaces:
        tcp = ("iifname", iface, "meta l4proto tcp", "counter")
        r.add("nat", ISTIO_PREROUTING, *tcp, "redirect to", f":{constants.ZTUNNEL_OUTBOUND_PORT}")
        r.add("nat", ISTIO_PREROUTING, *tcp, "return")
    r.add(
        "mangle",
        ISTIO_PREROUTING,
        "meta mark & 0xfff ==",
        INPOD_MARK,
        "counter",
        "ct mark set ct mark & 0xfffff000 | ",
        TPROXY_MARK,
    )
    _probes(r, options)
    if not options.ingress:
        _inbound(r)
    r.add(
        "mangle",
        ISTIO_OUTPUT,
        "ct mark and",
        TPROXY_MASK,
        "==",
        TPROXY_MARK,
        "counter",
        "meta mark set ct mark",
    )
    if dns:
        _dns(r)
    _outbound(r)
    return r.rules


def _probes(r: _Rules, options: PodRuleOptions) -> None:
    """Kubelet's SNATed probes (and their replies) skip ztunnel."""
    v4, v6 = options.probe_snat, options.probe_snat_v6
    if not options.ingress:
        r.add("nat", ISTIO_PREROUTING, "meta l4proto tcp", "ip saddr", v4, "counter", "accept")
        r.add(
            "nat",
            ISTIO_PREROUTING,
            "meta l4proto tcp",
            "ip6 saddr",
            v6,
            "counter",
            "accept",
            v6=True,
        )
    r.add("nat", ISTIO_OUTPUT, "meta l4proto tcp", "ip daddr", v4, "counter", "accept")
    r.add("nat", ISTIO_OUTPUT, "meta l4proto tcp", "ip6 daddr", v6, "counter", "accept", v6=True)


def _inbound(r: _Rules) -> None:
    """Unmarked inbound TCP to ztunnel's plaintext port; 15008 (HBONE) goes straight in."""
    to = f":{constants.ZTUNNEL_INBOUND_PLAINTEXT_PORT}"
    port = constants.ZTUNNEL_INBOUND_PORT
    # Istio's IPv4 rule has "mark and 0xfff " (a trailing space): kept as it prints it.
    r.add("nat", ISTIO_PREROUTING, "ip daddr", "!=", LOOP4, "tcp dport", "!=", port,
          "mark and 0xfff ", "!=", INPOD_MARK, "counter", "redirect to", to)  # fmt: skip
    r.add("nat", ISTIO_PREROUTING, "ip6 daddr", "!=", LOOP6, "tcp dport", "!=", port,
          "mark and 0xfff", "!=", INPOD_MARK, "counter", "redirect to", to, v6=True)  # fmt: skip


def _dns(r: _Rules) -> None:
    """DNS to ztunnel's DNS proxy; the proxy's own upstream queries in conntrack zone 1."""
    to = f":{constants.ZTUNNEL_DNS_PORT}"
    unmarked = ("mark and", INPOD_MASK, "!=", INPOD_MARK)
    r.add("nat", ISTIO_OUTPUT, "oifname", "!=", "lo", *unmarked, "udp dport", "53", "counter",
          "redirect to", to)  # fmt: skip
    r.add("nat", ISTIO_OUTPUT, "ip daddr", "!=", LOOP4, "tcp dport", "53", *unmarked, "counter",
          "redirect to", to)  # fmt: skip
    r.add("nat", ISTIO_OUTPUT, "ip6 daddr", "!=", LOOP6, "tcp dport", "53", *unmarked, "counter",
          "redirect to", to, v6=True)  # fmt: skip
    r.add("raw", ISTIO_OUTPUT, "udp dport", "53", "meta mark and", INPOD_MASK, "==", INPOD_MARK,
          "counter", "ct zone set", "1")  # fmt: skip
    r.add("raw", ISTIO_PREROUTING, "udp sport", "53", "meta mark and", INPOD_MASK, "!=",
          INPOD_MARK, "counter", "ct zone set", "1")  # fmt: skip


def _outbound(r: _Rules) -> None:
    """Marked traffic (ztunnel's own) and the pod calling itself pass; the rest to 15001."""
    r.add("nat", ISTIO_OUTPUT, "meta l4proto tcp", "mark and", TPROXY_MASK, "==", TPROXY_MARK,
          "counter", "accept")  # fmt: skip
    r.add("nat", ISTIO_OUTPUT, "oifname", "lo", "ip daddr", "!=", LOOP4, "counter", "accept")
    r.add("nat", ISTIO_OUTPUT, "oifname", "lo", "ip6 daddr", "!=", LOOP6, "counter", "accept",
          v6=True)  # fmt: skip
    to = f":{constants.ZTUNNEL_OUTBOUND_PORT}"
    unmarked = ("mark and", INPOD_MASK, "!=", INPOD_MARK, "counter", "redirect to", to)
    r.add("nat", ISTIO_OUTPUT, "meta l4proto tcp", "ip daddr", "!=", LOOP4, *unmarked)
    r.add("nat", ISTIO_OUTPUT, "meta l4proto tcp", "ip6 daddr", "!=", LOOP6, *unmarked, v6=True)


def host_rules(
    *, ipv6: bool, probe_snat: Address, probe_snat_v6: Address, kubelet_uid: Id
) -> list[NftRule]:
    """Istio's node-side probe SNAT (CreateHostRulesForHealthChecks, nftables form)."""
    r = _Rules(ipv6=ipv6)
    kubelet = ("meta l4proto tcp", "skuid", kubelet_uid)
    r.add("nat", POSTROUTING, *kubelet, "ip", "daddr", f"@{PROBE_IPSET_V4}", "counter", "snat",
          "to", probe_snat)  # fmt: skip
    r.add("nat", POSTROUTING, *kubelet, "ip6", "daddr", f"@{PROBE_IPSET_V6}", "counter", "snat",
          "to", probe_snat_v6, v6=True)  # fmt: skip
    return r.rules


def commands(rules: list[NftRule]) -> str:
    """The `nft -f` commands Istio's transaction prints: per table, `add`, `flush`, the chains
    that have rules or are jumped to, then each rule."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        mine = [rule for rule in rules if rule.table == table]
        if not mine:
            continue
        name = f"inet {TABLE_PREFIX}{table}"
        lines += [f"add table {name}", f"flush table {name}"]
        used = {rule.chain for rule in mine}
        used |= {w[i + 1] for w in (r.expr.split() for r in mine) for i in _jumps(w)}
        for chain in (c for c in CHAINS if c in used):
            base = BASE_CHAINS.get((table, chain))
            lines.append(f"add chain {name} {chain}" + (f" {{ {base} }}" if base else ""))
        lines += [f"add rule {name} {rule.chain} {rule.expr}" for rule in mine]
    return "".join(line + "\n" for line in lines)


def _jumps(words: list[str]) -> list[int]:
    return [i for i, w in enumerate(words[:-1]) if w == "jump"]


def set_commands(*, ipv6: bool) -> str:
    """Istio's host set manager start-up: the node table and its (kept) enrolled-IP sets."""
    lines = [f"add table {HOST_TABLE}"]
    sets = [(PROBE_IPSET_V4, "ipv4_addr")] + ([(PROBE_IPSET_V6, "ipv6_addr")] if ipv6 else [])
    for name, kind in sets:
        lines.append(f'add set {HOST_TABLE} {name} {{ type {kind} ; comment "{SET_COMMENT}" ; }}')
    return "".join(line + "\n" for line in lines)


def render_pod(options: PodRuleOptions) -> str:
    return commands(pod_rules(options))


def render_host(*, ipv6: bool, probe_snat: Address, probe_snat_v6: Address, kubelet_uid: Id) -> str:
    return commands(
        host_rules(
            ipv6=ipv6, probe_snat=probe_snat, probe_snat_v6=probe_snat_v6, kubelet_uid=kubelet_uid
        )
    )
