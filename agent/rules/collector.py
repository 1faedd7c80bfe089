"""Collect rules into the model in Istio's order: what both modes' builders share.

`RuleCollector` is Istio's rule builder (AppendRule, AppendVersionedRule): rules per family, in
the order they are added; `AddressSlot` is a rule with one address filled in per family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.podinput.tokens import Address, ChainName, Cidr
from agent.rules.model import Family, Match, Rule, RuleSet, TableName, Target, group_tables


def src(cidr: Cidr | Address) -> Match:
    return Match("src", cidr)


def dst(cidr: Cidr | Address, negate: bool = False) -> Match:
    return Match("dst", cidr, negate)


def jump(chain: str) -> Target:
    """A jump to one of our chains, a built-in chain or a verdict (names from this code)."""
    return Target("jump", ChainName(chain))


RETURN = jump("RETURN")


@dataclass
class RuleCollector:
    """Collects rule operations per family in Istio's order (AppendRule, AppendVersionedRule)."""

    ipv6: bool
    v4: list[Rule] = field(default_factory=list)
    v6: list[Rule] = field(default_factory=list)

    def add(
        self,
        table: TableName,
        chain: str,
        matches: Sequence[Match],
        target: Target,
        *,
        families: tuple[Family, ...] = (4, 6),
        insert_at: int | None = None,
    ) -> None:
        rule = Rule(table, ChainName(chain), tuple(matches), target, insert_at)
        if 4 in families:
            self.v4.append(rule)
        if 6 in families and self.ipv6:
            self.v6.append(rule)

    def versioned(
        self,
        table: TableName,
        chain: str,
        v4_addr: Cidr | Address,
        v6_addr: Cidr | Address,
        make: AddressSlot,
        target: Target,
    ) -> None:
        """One rule per family that differs only in an address (Istio's AppendVersionedRule)."""
        self.add(table, chain, make(v4_addr), target, families=(4,))
        self.add(table, chain, make(v6_addr), target, families=(6,))

    def ruleset(self) -> RuleSet:
        return RuleSet(v4=group_tables(self.v4), v6=group_tables(self.v6) if self.ipv6 else ())


class AddressSlot:
    """A rule's matches with one address slot, filled per family."""

    def __init__(self, *parts: Match | str) -> None:
        self.parts = parts

    def __call__(self, addr: Cidr | Address) -> list[Match]:
        out: list[Match] = []
        for part in self.parts:
            if isinstance(part, Match):
                out.append(part)
            elif part == "dst":
                out.append(dst(addr))
            elif part == "!dst":
                out.append(dst(addr, negate=True))
            elif part == "src":
                out.append(src(addr))
        return out
