"""Render model rules the way `iptables-save` prints them back from the kernel.

The kernel does not keep Istio's spelling: addresses come first, ports gain `-m tcp`, marks turn
hex. This form lets us compare what is in a namespace with what we meant to put there (CNI
CHECK, read-back tests) and recognise our rules among other software's.
"""

from __future__ import annotations

import grp
import ipaddress

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


def save_line(rule: Rule, *, family: Family) -> str:
    head: list[str] = [f"-A {rule.chain}"]
    order = ("src", "dst", "in", "out", "proto")
    for kind in order:
        for m in rule.matches:
            if m.kind == kind:
                head.append(_basic(m, family))
    proto = next((m.value for m in rule.matches if m.kind == "proto"), "")
    loaded: set[str] = set()  # protocol matches already named: `--dport` joins them
    for m in rule.matches:
        if m.kind == "module":
            loaded.add(m.value)
            head.append(f"-m {m.value}")
        elif m.kind in ("dport", "sport") and proto in loaded:
            head.append(f"{_neg(m)}--{m.kind} {m.value}")
        elif m.kind not in order:
            if m.kind in ("dport", "sport"):
                loaded.add(proto)
            head.append(_extension(m, proto))
    head.append(_target(rule.target, family))
    return " ".join(head)


def _neg(m: Match) -> str:
    return "! " if m.negate else ""


def _basic(m: Match, family: Family) -> str:
    flag = {"src": "-s", "dst": "-d", "in": "-i", "out": "-o", "proto": "-p"}[m.kind]
    value = m.value.strip()
    if m.kind in ("src", "dst"):
        net = ipaddress.ip_network(value, strict=False)
        value = f"{net.network_address}/{net.prefixlen}"
    return f"{_neg(m)}{flag} {value}"


def _extension(m: Match, proto: str) -> str:
    if m.kind in ("dport", "sport"):
        return f"-m {proto} {_neg(m)}--{m.kind} {m.value.strip()}"
    if m.kind == "dports":
        return f"-m multiport {_neg(m)}--dports {m.value.strip()}"
    if m.kind == "uid":
        return f"-m owner {_neg(m)}--uid-owner {m.value.strip()}"
    if m.kind == "gid":
        return f"-m owner {_neg(m)}--gid-owner {_gid(m.value.strip())}"
    if m.kind == "ctstate":
        return f"-m conntrack {_neg(m)}--ctstate {m.value.strip()}"
    if m.kind == "mark":
        return f"-m mark {_neg(m)}--mark {_hex(m.value.strip())}"
    if m.kind == "connmark":
        return f"-m connmark {_neg(m)}--mark {_hex(m.value)}"
    if m.kind == "socket_exists":
        return f"-m owner {_neg(m)}--socket-exists"
    if m.kind == "match_set":
        return f"-m set {_neg(m)}--match-set {m.value}"
    raise AssertionError(f"unknown match kind {m.kind}")


def _target(t: Target, family: Family) -> str:
    if t.kind == "jump":
        return f"-j {t.value}"
    if t.kind == "redirect":
        return f"-j REDIRECT --to-ports {t.value}"
    if t.kind == "tproxy":
        on_ip = "0.0.0.0" if family == 4 else "::"
        mark = f"{_hex(t.mark)}/0xffffffff"
        return f"-j TPROXY --on-port {t.value} --on-ip {on_ip} --tproxy-mark {mark}"
    if t.kind == "set_mark":
        return f"-j MARK --set-xmark {_hex(t.value)}/0xffffffff"
    if t.kind == "save_mark":
        return "-j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff"
    if t.kind == "restore_mark":
        return "-j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"
    if t.kind == "ct_zone":
        return f"-j CT --zone {t.value}"
    if t.kind == "connmark_set":
        return f"-j CONNMARK --set-xmark {_hex(t.value)}"
    if t.kind == "snat":
        return f"-j SNAT --to-source {t.value}"
    raise AssertionError(f"unknown target kind {t.kind}")


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
