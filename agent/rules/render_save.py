"""Render model rules the way `iptables-save` prints them back from the kernel.

The kernel does not keep Istio's spelling: addresses come first, ports gain `-m tcp`, marks turn
hex. This form lets us compare what is in a namespace with what we meant to put there (CNI
CHECK, read-back tests) and recognise our rules among other software's.
"""

from __future__ import annotations

import grp
import ipaddress
from typing import Literal, assert_never

from agent.rules.model import Family, Match, Rule, TableRules, Target


def save_tables(
    tables: tuple[TableRules, ...], *, family: Family
) -> dict[str, dict[str, list[str]]]:
    """table -> chain -> rule lines (`-A CHAIN ...`) in kernel order, as iptables-save prints."""
    out: dict[str, dict[str, list[str]]] = {}
    for table in tables:
        chains = table.final_chains()
        out[table.name] = {
            chain: [save_line(rule, family=family) for rule in rules]
            for chain, rules in chains.items()
        }
    return out


BasicKind = Literal["src", "dst", "in", "out", "proto"]
BASIC_ORDER: tuple[BasicKind, ...] = ("src", "dst", "in", "out", "proto")
"""The matches iptables-save prints first, in this order, whatever order they were added in."""
BASIC_FLAGS: dict[BasicKind, str] = {
    "src": "-s",
    "dst": "-d",
    "in": "-i",
    "out": "-o",
    "proto": "-p",
}


def save_line(rule: Rule, *, family: Family) -> str:
    head: list[str] = [f"-A {rule.chain}"]
    for basic in BASIC_ORDER:
        head.extend(_basic(m, basic, family) for m in rule.matches if m.kind == basic)
    proto = next((m.value for m in rule.matches if m.kind == "proto"), "")
    loaded: set[str] = set()  # protocol matches already named: `--dport` joins them
    for m in rule.matches:
        kind = m.kind
        match kind:
            case "src" | "dst" | "in" | "out" | "proto":
                pass  # printed above
            case "module":
                loaded.add(m.value)
                head.append(f"-m {m.value}")
            case "dport" | "sport":
                if proto in loaded:
                    head.append(f"{_neg(m)}--{kind} {m.value}")
                else:
                    loaded.add(proto)
                    head.append(f"-m {proto} {_neg(m)}--{kind} {m.value.strip()}")
            case _:
                head.append(_extension(m, kind))
    head.append(_target(rule.target, family))
    return " ".join(head)


def _neg(m: Match) -> str:
    return "! " if m.negate else ""


def _basic(m: Match, kind: BasicKind, family: Family) -> str:
    value = m.value.strip()
    if kind in ("src", "dst"):
        net = ipaddress.ip_network(value, strict=False)
        value = f"{net.network_address}/{net.prefixlen}"
    return f"{_neg(m)}{BASIC_FLAGS[kind]} {value}"


ExtensionKind = Literal[
    "dports", "uid", "gid", "ctstate", "mark", "connmark", "socket_exists", "match_set"
]


def _extension(m: Match, kind: ExtensionKind) -> str:
    match kind:
        case "dports":
            return f"-m multiport {_neg(m)}--dports {m.value.strip()}"
        case "uid":
            return f"-m owner {_neg(m)}--uid-owner {m.value.strip()}"
        case "gid":
            return f"-m owner {_neg(m)}--gid-owner {_gid(m.value.strip())}"
        case "ctstate":
            return f"-m conntrack {_neg(m)}--ctstate {m.value.strip()}"
        case "mark":
            return f"-m mark {_neg(m)}--mark {_hex(m.value.strip())}"
        case "connmark":
            return f"-m connmark {_neg(m)}--mark {_hex(m.value)}"
        case "socket_exists":
            return f"-m owner {_neg(m)}--socket-exists"
        case "match_set":
            return f"-m set {_neg(m)}--match-set {m.value} dst"
        case _:
            assert_never(kind)


def _target(t: Target, family: Family) -> str:
    kind = t.kind
    match kind:
        case "jump":
            return f"-j {t.value}"
        case "redirect":
            return f"-j REDIRECT --to-ports {t.value}"
        case "tproxy":
            on_ip = "0.0.0.0" if family == 4 else "::"
            mark = f"{_hex(t.mark or '')}/0xffffffff"
            return f"-j TPROXY --on-port {t.value} --on-ip {on_ip} --tproxy-mark {mark}"
        case "set_mark":
            return f"-j MARK --set-xmark {_hex(t.value)}/0xffffffff"
        case "save_mark":
            return "-j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff"
        case "restore_mark":
            return "-j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"
        case "ct_zone":
            return f"-j CT --zone {t.value}"
        case "connmark_set":
            return f"-j CONNMARK --set-xmark {_hex(t.value)}"
        case "snat":
            return f"-j SNAT --to-source {t.value}"
        case _:
            assert_never(kind)


def _hex(value: str) -> str:
    """`1337` -> `0x539`; a `mark/mask` pair keeps its mask."""
    return "/".join(hex(int(part, 0)) for part in value.split("/"))


def _gid(value: str) -> str:
    if value.isdigit():
        return value
    try:
        return str(grp.getgrnam(value).gr_gid)
    except KeyError:
        return value


def parse_save(text: str) -> dict[str, dict[str, list[str]]]:
    """iptables-save output -> table -> chain -> `-A` lines (every chain, builtin or not)."""
    out: dict[str, dict[str, list[str]]] = {}
    table: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            table = out.setdefault(line[1:].strip(), {})
        elif table is None or not line or line.startswith("#") or line == "COMMIT":
            continue
        elif line.startswith(":"):
            table.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            table.setdefault(line.split()[1], []).append(line)
    return out
