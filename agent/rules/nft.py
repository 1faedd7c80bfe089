"""Istio's native nftables form: the engine both modes write their nftables rules in.

Istio's nftables modes do not translate its iptables rules: each writes its own rules into three
`inet` tables (`<prefix>nat`, `-mangle`, `-raw`) with lower-case chains and base chains at
Istio's priorities. A mode keeps its rules as data, one rule a line (`table chain expression`,
Istio's words with `{name}` slots), and adds them in Istio's order through `NftRules`;
`commands` prints the `nft -f` commands Istio's transaction prints, one a line: per table
`add table`, `flush table`, its chains, then each rule (`add rule`, or `insert rule ... index
N`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agent.rules.model import check_nft_rule

SIDECAR_PREFIX = "istio-proxy-"
"""Sidecar mode's tables: `inet istio-proxy-nat`, `-mangle`, `-raw`."""
AMBIENT_PREFIX = "istio-ambient-"
"""Ambient mode's tables: the same three in a pod, `inet istio-ambient-nat` on the node."""

NftTable = Literal["nat", "mangle", "raw"]
TABLE_ORDER: tuple[NftTable, ...] = ("nat", "mangle", "raw")

PREROUTING, OUTPUT, POSTROUTING = "prerouting", "output", "postrouting"
BASE_CHAINS: dict[tuple[NftTable, str], str] = {
    ("nat", PREROUTING): "type nat hook prerouting priority -100 ;",
    ("nat", OUTPUT): "type nat hook output priority -100 ;",
    ("nat", POSTROUTING): "type nat hook postrouting priority 100 ;",
    ("mangle", PREROUTING): "type filter hook prerouting priority -150 ;",
    ("mangle", OUTPUT): "type route hook output priority -150 ;",
    ("raw", PREROUTING): "type filter hook prerouting priority -300 ;",
    ("raw", OUTPUT): "type filter hook output priority -300 ;",
}
"""Base chains at Istio's priorities (dstnat, srcnat, mangle, raw), written as numbers as
knftables writes them."""


@dataclass(frozen=True)
class NftRule:
    table: NftTable
    chain: str
    expr: str
    index: int | None = None
    """Insert before this position (Istio's InsertRule); None appends."""

    def __post_init__(self) -> None:
        check_nft_rule(self.chain, self.expr)


@dataclass
class NftRules:
    """A mode's rules in the order it adds them. `templates`: name -> `table chain expression`,
    whose `{slots}` are filled from `values` (the mode's constants) and each call's own."""

    templates: Mapping[str, str]
    ipv6: bool
    values: Mapping[str, str] = field(default_factory=dict)
    rules: list[NftRule] = field(default_factory=list)

    def add(self, rule: str, /, *, v6: bool = False, **values: str) -> None:
        """Append template `rule` (an IPv6-only one, `v6`, only when IPv6 is on)."""
        self._rule(rule, None, v6, values)

    def insert(self, rule: str, index: int, /, *, v6: bool = False, **values: str) -> None:
        """Insert template `rule` before position `index` of its chain (Istio's InsertRule)."""
        self._rule(rule, index, v6, values)

    def _rule(self, name: str, index: int | None, v6: bool, values: Mapping[str, str]) -> None:
        if v6 and not self.ipv6:
            return
        table, chain, expr = (
            self.templates[name].format_map({**self.values, **values}).split(" ", 2)
        )
        if table not in TABLE_ORDER:
            raise ValueError(f"nft rule {name!r}: {table!r} is not one of {TABLE_ORDER}")
        self.rules.append(NftRule(table, chain, expr, index))


def commands(
    rules: list[NftRule],
    *,
    prefix: str,
    chains: Mapping[NftTable, tuple[str, ...]],
    jumped_to: bool,
) -> str:
    """The `nft -f` commands for `rules` in the tables named `prefix`+table, as Istio's
    transaction writes them: a table only when it holds a rule; its chains in the order of
    `chains`, each only when it holds a rule or (`jumped_to`, as Istio's ambient mode does) is
    jumped to. Istio's sidecar mode declares only chains with rules, so a jump to an empty chain
    fails there as it fails in Istio."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        mine = [rule for rule in rules if rule.table == table]
        if not mine:
            continue
        name = f"inet {prefix}{table}"
        lines += [f"add table {name}", f"flush table {name}"]
        used = {rule.chain for rule in mine}
        if jumped_to:
            used |= {target for rule in mine for target in _jump_targets(rule)}
        for chain in (c for c in chains[table] if c in used):
            base = BASE_CHAINS.get((table, chain))
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


def _jump_targets(rule: NftRule) -> list[str]:
    words = rule.expr.split()
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "jump"]


def table_names(prefix: str) -> tuple[str, ...]:
    """A mode's three tables ("inet name") in Istio's order."""
    return tuple(f"inet {prefix}{table}" for table in TABLE_ORDER)


def cleanup(prefix: str) -> str:
    """Istio's `--cleanup-only` in native mode: each table declared, then deleted."""
    return "".join(f"add table {t}\ndelete table {t}\n" for t in table_names(prefix))
