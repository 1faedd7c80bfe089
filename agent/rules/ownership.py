"""Which rules in a namespace are ours, so apply and remove never touch other software's rules.

Our chains are the `ISTIO_*` chains. In the built-in chains we own the jumps into them and the
few rule shapes Istio writes there directly (`BuiltinShape`): interface short-circuits
(`-i/-o IFACE -j RETURN`) and the TPROXY mark bookkeeping in mangle. A rule read back from the
kernel, as an iptables-save line or a python-iptables object, is first reduced to a
`BuiltinRule`; one function decides for both forms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, assert_never, get_args

from agent.rules.model import BUILTIN_CHAINS, is_our_chain

OUR_TABLES = ("mangle", "nat", "raw")

BuiltinShape = Literal["iface_return", "mark_connmark", "lo_owner_mark", "lo_mark_return"]
"""The rules Istio writes straight into built-in chains (besides jumps into its own chains)."""
BUILTIN_SHAPES: tuple[BuiltinShape, ...] = get_args(BuiltinShape)
_ANY_PROTOCOL = ("", "ip", "all", "0")
_ANY_ADDRESS = ("", "0.0.0.0/0.0.0.0", "::/0")


@dataclass(frozen=True)
class BuiltinRule:
    """What ownership looks at in a kernel rule; a negated value keeps its leading `!`."""

    table: str
    target: str
    protocol: str = ""
    in_interface: str = ""
    out_interface: str = ""
    src: str = ""
    dst: str = ""
    modules: tuple[str, ...] = ()
    """The `-m` match modules, in order."""

    @property
    def any_address(self) -> bool:
        return self.src in _ANY_ADDRESS and self.dst in _ANY_ADDRESS


def has_shape(shape: BuiltinShape, r: BuiltinRule) -> bool:
    match shape:
        case "iface_return":  # -i/-o IFACE -j RETURN
            ifaces = [i for i in (r.in_interface, r.out_interface) if i]
            return (
                r.target == "RETURN"
                and r.table in ("nat", "mangle")
                and len(ifaces) == 1
                and not ifaces[0].startswith("!")
                and r.protocol in _ANY_PROTOCOL
                and r.any_address
                and not r.modules
            )
        case "mark_connmark":  # mangle: -p tcp -m mark|connmark --mark M -j CONNMARK ...
            return (
                r.target == "CONNMARK"
                and r.table == "mangle"
                and r.protocol == "tcp"
                and not r.in_interface
                and not r.out_interface
                and r.any_address
                and r.modules[:1] in (("mark",), ("connmark",))
            )
        case "lo_owner_mark":  # mangle: ... -o lo -p tcp -m owner ... -j MARK
            return (
                r.target == "MARK"
                and r.table == "mangle"
                and r.protocol == "tcp"
                and r.out_interface == "lo"
                and "owner" in r.modules
            )
        case "lo_mark_return":  # mangle: -o lo -p tcp -m mark --mark M -j RETURN
            return (
                r.target == "RETURN"
                and r.table == "mangle"
                and r.protocol == "tcp"
                and r.out_interface == "lo"
                and not r.in_interface
                and r.any_address
                and r.modules[:1] == ("mark",)
            )
        case _:
            assert_never(shape)


def is_our_builtin_rule(rule: BuiltinRule) -> bool:
    """A rule in a built-in chain that sidecar mode owns."""
    return is_our_chain(rule.target) or any(has_shape(s, rule) for s in BUILTIN_SHAPES)


_SAVE_FIELDS = {
    "-p": "protocol",
    "-i": "in_interface",
    "-o": "out_interface",
    "-s": "src",
    "-d": "dst",
}


def save_line_rule(table: str, line: str) -> BuiltinRule:
    """An `-A CHAIN ...` line of iptables-save as a BuiltinRule."""
    words = line.split()[2:]
    fields: dict[str, str] = {}
    modules: list[str] = []
    target = ""
    negate = False
    at = 0
    while at < len(words):
        word = words[at]
        value = words[at + 1] if at + 1 < len(words) else ""
        if word == "!":
            negate = True
            at += 1
            continue
        if word in _SAVE_FIELDS:
            fields[_SAVE_FIELDS[word]] = ("!" if negate else "") + value
            at += 1
        elif word == "-m":
            modules.append(value)
            at += 1
        elif word == "-j":
            target = value
            break
        negate = False
        at += 1
    return BuiltinRule(table=table, target=target, modules=tuple(modules), **fields)


def iptc_rule_view(table: str, rule: Any) -> BuiltinRule:
    """A python-iptables rule as a BuiltinRule."""
    return BuiltinRule(
        table=table,
        target=rule.target.name if rule.target is not None else "",
        protocol=rule.protocol or "",
        in_interface=rule.in_interface or "",
        out_interface=rule.out_interface or "",
        src=rule.src or "",
        dst=rule.dst or "",
        modules=tuple(m.name for m in rule.matches),
    )


def is_our_save_line(table: str, line: str) -> bool:
    """`line` is an `-A CHAIN ...` line of iptables-save in a built-in chain."""
    return is_our_builtin_rule(save_line_rule(table, line))


def is_our_iptc_rule(table: str, rule: Any) -> bool:
    """The same test for a python-iptables rule in a built-in chain."""
    return is_our_builtin_rule(iptc_rule_view(table, rule))


def builtin(chain: str) -> bool:
    return chain in BUILTIN_CHAINS


@dataclass(frozen=True)
class Ownership:
    """Which chains and built-in-chain rules one rule set owns: apply replaces only those,
    remove takes out only those. Sidecar mode owns every `ISTIO_*` chain; ambient owns a few
    named chains and only its jumps into them (agent.rules.ambient.builder)."""

    chain: Callable[[str], bool] = is_our_chain
    save_line: Callable[[str, str], bool] = is_our_save_line
    iptc_rule: Callable[[str, Any], bool] = is_our_iptc_rule


SIDECAR = Ownership()


def jumps_into(chains: frozenset[str]) -> Ownership:
    """Own exactly `chains` and the jumps into them from built-in chains."""

    def save_line(table: str, line: str) -> bool:
        words = line.split()
        return "-j" in words and words[-1] in chains and words[-2] == "-j"

    def iptc_rule(table: str, rule: Any) -> bool:
        return rule.target is not None and rule.target.name in chains

    return Ownership(chain=chains.__contains__, save_line=save_line, iptc_rule=iptc_rule)
