"""Render model rules as python-iptables (`iptc`) objects for the in-process legacy backend.

python-iptables parses each option with the same xtables extension that `iptables` uses, so a
rule built here is the rule `iptables-restore` would build from our text; negation is a leading
`!` on the value.
"""

from __future__ import annotations

from typing import Any, assert_never

from agent.rules.model import Match, Rule, Target


def iptc_rule(rule: Rule, *, family: int) -> Any:
    """A new `iptc.Rule` (or `Rule6`) equal to `rule`."""
    import iptc

    r = iptc.Rule() if family == 4 else iptc.Rule6()
    proto = ""
    for m in rule.matches:
        _apply_match(r, m, proto)
        if m.kind == "proto":
            proto = m.value
    _apply_target(r, rule.target)
    return r


def _neg(m: Match) -> str:
    value = m.value.strip()  # spelled as given; the kernel takes it trimmed
    return f"!{value}" if m.negate else value


def _apply_match(r: Any, m: Match, proto: str) -> None:
    kind = m.kind
    match kind:
        case "proto":
            r.protocol = _neg(m)
        case "in":
            r.in_interface = _neg(m)
        case "out":
            r.out_interface = _neg(m)
        case "src":
            r.src = _neg(m)
        case "dst":
            r.dst = _neg(m)
        case "dport" | "sport":
            setattr(_match(r, proto), kind, _neg(m))
        case "dports":
            r.create_match("multiport").dports = _neg(m)
        case "uid":
            r.create_match("owner").uid_owner = _neg(m)
        case "gid":
            r.create_match("owner").gid_owner = _neg(m)
        case "ctstate":
            r.create_match("conntrack").ctstate = _neg(m)
        case "mark":
            r.create_match("mark").mark = _neg(m)
        case "connmark":
            r.create_match("connmark").mark = _neg(m)
        case "module":
            _match(r, m.value)
        case "socket_exists":
            r.create_match("owner").socket_exists = "!" if m.negate else ""
        case "match_set":
            r.create_match("set").match_set = [str(m.value), "dst"]
        case _:
            assert_never(kind)


def _match(r: Any, proto: str) -> Any:
    """The implicit `-m tcp`/`-m udp` of `--dport`, shared by both port options."""
    for existing in r.matches:
        if existing.name == proto:
            return existing
    return r.create_match(proto)


def _apply_target(r: Any, t: Target) -> None:
    kind = t.kind
    match kind:
        case "jump":
            r.create_target(t.value)
        case "redirect":
            r.create_target("REDIRECT").to_ports = t.value
        case "tproxy":
            target = r.create_target("TPROXY")
            target.tproxy_mark = f"{t.mark}/0xffffffff"
            target.on_port = t.value
        case "set_mark":
            r.create_target("MARK").set_mark = t.value
        case "save_mark":
            r.create_target("CONNMARK").save_mark = ""
        case "restore_mark":
            target = r.create_target("CONNMARK")
            target.restore_mark = ""
            if t.mark:
                target.nfmask = t.mark
                target.ctmask = t.mark
        case "ct_zone":
            r.create_target("CT").zone = t.value
        case "connmark_set":
            r.create_target("CONNMARK").set_xmark = t.value
        case "snat":
            r.create_target("SNAT").to_source = t.value
        case _:
            assert_never(kind)
