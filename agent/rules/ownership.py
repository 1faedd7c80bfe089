"""Which rules in a namespace are ours, so apply and remove never touch other software's rules.

Our chains are the `ISTIO_*` chains. In the built-in chains we own the jumps into them and the
few rule shapes Istio writes there directly: interface short-circuits (`-i/-o IFACE -j RETURN`)
and the TPROXY mark bookkeeping in mangle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.rules.model import BUILTIN_CHAINS, is_our_chain

OUR_TABLES = ("mangle", "nat", "raw")


def is_our_save_line(table: str, line: str) -> bool:
    """`line` is an `-A CHAIN ...` line of iptables-save in a built-in chain."""
    words = line.split()
    if "-j" not in words:
        return False
    at = words.index("-j")
    target = words[at + 1] if at + 1 < len(words) else ""
    body = words[2:at]
    if is_our_chain(target):
        return True
    if (
        target == "RETURN"
        and table in ("nat", "mangle")
        and len(body) == 2
        and body[0]
        in (
            "-i",
            "-o",
        )
    ):
        return True
    if table != "mangle":
        return False
    text = " ".join(body)
    if target == "CONNMARK":
        return text.startswith("-p tcp -m mark --mark ") or text.startswith(
            "-p tcp -m connmark --mark "
        )
    if target == "MARK":
        return "-o lo -p tcp -m owner" in text
    return target == "RETURN" and text.startswith("-o lo -p tcp -m mark --mark ")


def is_our_iptc_rule(table: str, rule: Any) -> bool:
    """The same test for a python-iptables rule in a built-in chain."""
    target = rule.target.name if rule.target is not None else ""
    if is_our_chain(target):
        return True
    matches = [m.name for m in rule.matches]
    ifaces = [i for i in (rule.in_interface, rule.out_interface) if i]
    any_addr = ("0.0.0.0/0.0.0.0", "::/0")
    plain = rule.src in any_addr and rule.dst in any_addr and rule.protocol in ("ip", "all", "0")
    if target == "RETURN" and table in ("nat", "mangle") and not matches and plain:
        return len(ifaces) == 1
    if table != "mangle" or rule.protocol != "tcp":
        return False
    if target == "CONNMARK":
        return matches in (["mark"], ["connmark"])
    if target == "MARK":
        return rule.out_interface == "lo" and "owner" in matches
    return target == "RETURN" and rule.out_interface == "lo" and matches == ["mark"]


def builtin(chain: str) -> bool:
    return chain in BUILTIN_CHAINS


@dataclass(frozen=True)
class Ownership:
    """Which chains and built-in-chain rules one rule set owns: apply replaces only those,
    remove takes out only those. Sidecar mode owns every `ISTIO_*` chain; ambient owns a few
    named chains and only its jumps into them (agent.rules.ambient)."""

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
