"""The structured rule model every renderer reads: rules as typed matches and one target.

A `Rule` keeps its matches in the order Istio writes them, so the iptables-restore renderer
reproduces Istio's spelling exactly, while the nftables and python-iptables renderers read the
same facts without parsing text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, assert_never

Family = Literal[4, 6]
TableName = Literal["mangle", "nat", "raw"]

BUILTIN_CHAINS = frozenset({"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"})
VERDICTS = frozenset({"RETURN", "ACCEPT", "DROP"})
CHAIN_PREFIX = "ISTIO_"

MatchKind = Literal[
    "proto",  # -p tcp
    "in",  # -i IFACE
    "out",  # -o IFACE
    "src",  # -s CIDR
    "dst",  # -d CIDR
    "dport",  # --dport N (needs a proto match before it)
    "sport",  # --sport N
    "dports",  # -m multiport --dports A,B
    "uid",  # -m owner --uid-owner N
    "gid",  # -m owner --gid-owner G
    "ctstate",  # -m conntrack --ctstate STATES
    "mark",  # -m mark --mark N
    "connmark",  # -m connmark --mark N
    "module",  # -m tcp (a protocol match named on its own, as ambient writes it)
    "socket_exists",  # -m owner --socket-exists
    "match_set",  # -m set --match-set NAME DIR (value "NAME DIR")
]

TargetKind = Literal[
    "jump",  # -j CHAIN or a verdict (RETURN, ACCEPT, DROP)
    "redirect",  # -j REDIRECT --to-ports N
    "tproxy",  # -j TPROXY --tproxy-mark M/0xffffffff --on-port N
    "set_mark",  # -j MARK --set-mark N
    "save_mark",  # -j CONNMARK --save-mark
    "restore_mark",  # -j CONNMARK --restore-mark
    "ct_zone",  # -j CT --zone N
    "connmark_set",  # -j CONNMARK --set-xmark V/M
    "snat",  # -j SNAT --to-source ADDR
]


@dataclass(frozen=True)
class Match:
    kind: MatchKind
    value: str
    negate: bool = False


@dataclass(frozen=True)
class Target:
    kind: TargetKind
    value: str = ""
    """Chain or verdict for jump; port for redirect/tproxy; mark for set_mark; zone."""
    mark: str = ""
    """TPROXY's mark; for restore_mark, the --nfmask/--ctmask when Istio spells them."""
    spelling: str = ""
    """REDIRECT's option as Istio spells it (`--to-ports` or `--to-port`)."""


@dataclass(frozen=True)
class Rule:
    table: TableName
    chain: str
    matches: tuple[Match, ...]
    target: Target
    insert_at: int | None = None
    """None appends; N inserts at position N (1-based), as `-I CHAIN N`."""


@dataclass(frozen=True)
class TableRules:
    """One table of one family: chains to create (in order) and the rule operations in order."""

    name: TableName
    chains: tuple[str, ...]
    rules: tuple[Rule, ...]

    def final_chains(self) -> dict[str, list[Rule]]:
        """Each chain's rules after the appends and inserts, in order: what the kernel holds."""
        out: dict[str, list[Rule]] = {chain: [] for chain in self.chains}
        for rule in self.rules:
            rules = out.setdefault(rule.chain, [])
            if rule.insert_at is None:
                rules.append(rule)
            else:
                rules.insert(min(rule.insert_at - 1, len(rules)), rule)
        return out


@dataclass(frozen=True)
class RuleSet:
    """Everything for one pod: IPv4 tables, then IPv6 tables (empty when IPv6 is off)."""

    v4: tuple[TableRules, ...]
    v6: tuple[TableRules, ...] = field(default=())

    def family(self, family: Family) -> tuple[TableRules, ...]:
        match family:
            case 4:
                return self.v4
            case 6:
                return self.v6
            case _:
                assert_never(family)


def group_tables(rules: Sequence[Rule]) -> tuple[TableRules, ...]:
    """Group one family's rule operations by table (tables sorted by name, as Istio does).

    Chains to create: every non-builtin chain that holds a rule, in order of its first rule,
    then every chain jumped to that holds none.
    """
    names = sorted({rule.table for rule in rules})
    tables: list[TableRules] = []
    for name in names:
        in_table = [rule for rule in rules if rule.table == name]
        chains: list[str] = []
        for rule in in_table:
            if rule.chain not in BUILTIN_CHAINS and rule.chain not in chains:
                chains.append(rule.chain)
        for chain in _jump_targets(in_table):
            if chain not in chains:
                chains.append(chain)
        tables.append(TableRules(name=name, chains=tuple(chains), rules=tuple(in_table)))
    return tuple(tables)


def _jump_targets(rules: Iterable[Rule]) -> list[str]:
    return [
        rule.target.value
        for rule in rules
        if rule.target.kind == "jump"
        and rule.target.value not in VERDICTS
        and rule.target.value not in BUILTIN_CHAINS
    ]


def is_our_chain(chain: str) -> bool:
    return chain.startswith(CHAIN_PREFIX)
