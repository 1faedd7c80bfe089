"""Render rules as native nftables (`nft -f` input).

Sidecar mode (`render_native`): Istio's own native nftables rules (agent.rules.native_nft) as the
commands Istio's transaction prints, one a line: `add table inet istio-proxy-nat`, `flush table`,
the chains that have rules, then each rule (`add rule`, or `insert rule ... index N`).

Ambient in-pod rules (`render`, `render_table`): the rule model rendered table by table. Each
iptables table of each family becomes its own nftables table (`ip istio-proxy-nat`,
`ip6 istio-proxy-mangle`, ...) with base chains at the iptables priorities, so our rules never
share a table with other software and can be replaced or removed as a whole. Expressions are
written in the form `nft list` prints them, so a listing reads back equal to what we rendered.
"""

from __future__ import annotations

import ipaddress
from typing import assert_never

from agent.rules.config import CaptureConfig
from agent.rules.model import BUILTIN_CHAINS, Family, Match, Rule, RuleSet, TableRules, Target
from agent.rules.native_nft import BASE_CHAINS as NATIVE_BASE_CHAINS
from agent.rules.native_nft import CHAINS, TABLE_ORDER, NftRule, build_native

TABLE_PREFIX = "istio-proxy-"

# (iptables table, built-in chain) -> nft base chain declaration.
BASE_CHAINS: dict[tuple[str, str], str] = {
    ("nat", "PREROUTING"): "type nat hook prerouting priority dstnat; policy accept;",
    ("nat", "OUTPUT"): "type nat hook output priority -100; policy accept;",
    ("mangle", "PREROUTING"): "type filter hook prerouting priority mangle; policy accept;",
    ("mangle", "OUTPUT"): "type route hook output priority mangle; policy accept;",
    ("raw", "PREROUTING"): "type filter hook prerouting priority raw; policy accept;",
    ("raw", "OUTPUT"): "type filter hook output priority raw; policy accept;",
}


def render_native(config: CaptureConfig) -> str:
    """Istio's native nftables commands for a sidecar's capture config."""
    return native_commands(build_native(config))


def native_commands(rules: list[NftRule]) -> str:
    """The `nft -f` commands for Istio's rules, table by table, as Istio's transaction writes
    them: a table (and each chain) only when it holds a rule."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        mine = [rule for rule in rules if rule.table == table]
        if not mine:
            continue
        name = f"inet {TABLE_PREFIX}{table}"
        lines += [f"add table {name}", f"flush table {name}"]
        used = {rule.chain for rule in mine}
        for chain in (c for c in CHAINS[table] if c in used):
            base = NATIVE_BASE_CHAINS.get((table, chain))
            lines.append(f"add chain {name} {chain}" + (f" {{ {base} }}" if base else ""))
        count: dict[str, int] = {}
        for rule in mine:
            seen = count.get(rule.chain, 0)
            # nft cannot insert at an index the chain does not have yet: Istio appends then.
            if rule.index is not None and rule.index < seen:
                lines.append(f"insert rule {name} {rule.chain} index {rule.index} {rule.expr}")
            else:
                lines.append(f"add rule {name} {rule.chain} {rule.expr}")
            count[rule.chain] = seen + 1
    return "".join(line + "\n" for line in lines)


def native_cleanup() -> str:
    """Istio's `--cleanup-only` in native mode: each table declared, then deleted."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        name = f"inet {TABLE_PREFIX}{table}"
        lines += [f"add table {name}", f"delete table {name}"]
    return "".join(line + "\n" for line in lines)


def nft_family(family: Family) -> str:
    return "ip" if family == 4 else "ip6"


def table_name(table: str) -> str:
    return TABLE_PREFIX + table


def render(ruleset: RuleSet) -> str:
    """All tables, IPv4 then IPv6."""
    parts = [render_table(t, family=4) for t in ruleset.v4]
    parts += [render_table(t, family=6) for t in ruleset.v6]
    return "".join(parts)


def render_table(table: TableRules, *, family: Family) -> str:
    lines = [f"table {nft_family(family)} {table_name(table.name)} {{"]
    chains = table.final_chains()
    order = [c for c in ("PREROUTING", "OUTPUT") if c in chains] + [
        c for c in chains if c not in BUILTIN_CHAINS
    ]
    for i, chain in enumerate(order):
        if i:
            lines.append("")
        lines.append(f"\tchain {chain_name(chain)} {{")
        if chain in BUILTIN_CHAINS:
            lines.append(f"\t\t{BASE_CHAINS[(table.name, chain)]}")
        lines.extend(f"\t\t{rule_expr(rule, family=family)}" for rule in chains[chain])
        lines.append("\t}")
    lines.append("}")
    return "".join(line + "\n" for line in lines)


def chain_name(chain: str) -> str:
    return chain.lower() if chain in BUILTIN_CHAINS else chain


def rule_expr(rule: Rule, *, family: Family) -> str:
    words: list[str] = []
    has_port = any(m.kind in ("dport", "sport", "dports") for m in rule.matches)
    proto = next((m.value for m in rule.matches if m.kind == "proto"), "")
    for m in rule.matches:
        if m.kind == "proto" and has_port:
            continue  # `tcp dport` implies the protocol; nft lists it without
        expr = _match(m, proto, family)
        if expr:
            words.append(expr)
    words.append(_target(rule.target, family))
    return " ".join(words)


class UnsupportedRule(ValueError):
    """A rule-model kind this renderer has no nftables form for (the message names it)."""


def _op(m: Match) -> str:
    return "!= " if m.negate else ""


def _addr(value: str) -> str:
    iface = ipaddress.ip_interface(value)
    net = iface.network
    if net.prefixlen == net.max_prefixlen:
        return str(net.network_address)
    return str(net)


def _hex(value: str) -> str:
    return f"0x{int(value, 0):08x}"


def _masked(key: str, m: Match) -> str:
    """`--mark V/M` -> `KEY & M == V`, as nft lists a masked comparison."""
    value, _, mask = m.value.strip().partition("/")
    if not mask:
        return f"{key} {_op(m)}{_hex(value)}"
    return f"{key} & {_hex(mask)} {'!=' if m.negate else '=='} {_hex(value)}"


def _match(m: Match, proto: str, family: Family) -> str:
    """The nft expression of one match; empty when another match already says it."""
    ip = "ip" if family == 4 else "ip6"
    kind = m.kind
    match kind:
        case "proto":
            return f"meta l4proto {_op(m)}{m.value.strip()}"
        case "in":
            return f'iifname {_op(m)}"{m.value.strip()}"'
        case "out":
            return f'oifname {_op(m)}"{m.value.strip()}"'
        case "src":
            return f"{ip} saddr {_op(m)}{_addr(m.value.strip())}"
        case "dst":
            return f"{ip} daddr {_op(m)}{_addr(m.value.strip())}"
        case "dport" | "sport":
            return f"{proto} {kind} {_op(m)}{m.value.strip()}"
        case "dports":
            ports = ", ".join(m.value.strip().split(","))
            return f"{proto} dport {_op(m)}{{ {ports} }}"
        case "uid":
            return f"meta skuid {_op(m)}{m.value.strip()}"
        case "gid":
            return f"meta skgid {_op(m)}{m.value.strip()}"
        case "ctstate":
            states = ",".join(sorted(s.lower() for s in m.value.strip().split(",")))
            return f"ct state {_op(m)}{states}"
        case "mark":
            return _masked("meta mark", m)
        case "connmark":
            return _masked("ct mark", m)
        case "module":
            return ""  # `-m tcp` alone: the protocol match says it all
        case "socket_exists" | "match_set":
            # Only the node-side ambient rules use these, and they are applied with iptables.
            raise UnsupportedRule(f"nftables renderer: no form for match {kind} {m.value!r}")
        case _:
            assert_never(kind)


def _target(t: Target, family: Family) -> str:
    kind = t.kind
    match kind:
        case "jump":
            verdicts = {"RETURN": "return", "ACCEPT": "accept", "DROP": "drop"}
            return verdicts.get(t.value, f"jump {t.value}")
        case "redirect":
            return f"redirect to :{t.value}"
        case "tproxy":
            return f"meta mark set {_hex(t.mark)} tproxy to :{t.value} accept"
        case "set_mark":
            return f"meta mark set {_hex(t.value)}"
        case "save_mark":
            return "ct mark set meta mark"
        case "restore_mark":
            return "meta mark set ct mark"
        case "ct_zone":
            return f"ct zone set {t.value}"
        case "connmark_set":
            value, _, mask = t.value.partition("/")
            # (ct & ~M) ^ V, listed by nft as one mask that keeps V's bits, then V
            keep = (0xFFFFFFFF ^ int(mask or "0xffffffff", 0)) | int(value, 0)
            return f"ct mark set ct mark & {keep:#010x} | {_hex(value)}"
        case "snat":
            raise UnsupportedRule(f"nftables renderer: no form for target snat {t.value!r}")
        case _:
            assert_never(kind)
