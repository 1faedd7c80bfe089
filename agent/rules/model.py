"""The structured rule model every renderer reads: rules as typed matches and one target.

A `Rule` keeps its matches in the order Istio writes them, so the iptables-restore renderer
reproduces Istio's spelling exactly, while the nftables and python-iptables renderers read the
same facts without parsing text.

Every value is a token of agent.podinput.tokens, of the kind its match or target takes (an
interface for `-i`, a CIDR for `-d`, ...): the constructors refuse anything else, a plain `str`
included, so no rule can carry text that was not validated into a rule program.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, assert_never

from agent.netns.look import Family as Family  # declared once, with the kernel's tables
from agent.podinput.tokens import (
    Address,
    ChainName,
    Cidr,
    GroupName,
    Id,
    InterfaceName,
    Mark,
    Padded,
    Port,
    PortList,
    SetName,
    Token,
    Word,
    Zone,
    core,
)

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
    "match_set",  # -m set --match-set NAME dst (value: the set's name)
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


Value = Token | Padded
"""What a match or target holds: a token, or one with the spaces an operator wrote around it."""

NO_VALUE = Word("tcp")
"""Placeholder of the matches and targets that take no value (`--socket-exists`, `--save-mark`);
never rendered."""

MATCH_VALUES: dict[str, tuple[type[Token], ...]] = {
    "proto": (Word,),
    "in": (InterfaceName,),
    "out": (InterfaceName,),
    "src": (Cidr, Address),
    "dst": (Cidr, Address),
    "dport": (Port,),
    "sport": (Port,),
    "dports": (PortList,),
    "uid": (Id,),
    "gid": (Id, GroupName),
    "ctstate": (Word,),
    "mark": (Mark,),
    "connmark": (Mark,),
    "module": (Word,),
    "socket_exists": (Word,),
    "match_set": (SetName,),
}
"""The token kinds each match takes."""

TARGET_VALUES: dict[str, tuple[type[Token], ...]] = {
    "jump": (ChainName,),
    "redirect": (Port,),
    "tproxy": (Port,),
    "set_mark": (Mark,),
    "save_mark": (Word,),
    "restore_mark": (Word,),
    "ct_zone": (Zone,),
    "connmark_set": (Mark,),
    "snat": (Address,),
}
"""The token kinds each target's value takes."""

REDIRECT_SPELLINGS = frozenset({"", "--to-ports", "--to-port"})


def _check_value(what: str, value: object, kinds: tuple[type[Token], ...]) -> None:
    inner = core(value) if isinstance(value, Token | Padded) else value
    if not isinstance(inner, kinds):
        want = " or ".join(k.__name__ for k in kinds)
        raise TypeError(f"{what} takes a {want} token, not {type(inner).__name__} {inner!r}")


@dataclass(frozen=True)
class Match:
    kind: MatchKind
    value: Value
    negate: bool = False

    def __post_init__(self) -> None:
        kinds = MATCH_VALUES.get(self.kind)
        if kinds is None:
            raise TypeError(f"unknown match kind {self.kind!r}")
        _check_value(f"match {self.kind}", self.value, kinds)


@dataclass(frozen=True)
class Target:
    kind: TargetKind
    value: Value = NO_VALUE
    """Chain or verdict for jump; port for redirect/tproxy; mark for set_mark; zone."""
    mark: Mark | None = None
    """TPROXY's mark; for restore_mark, the --nfmask/--ctmask when Istio spells them."""
    spelling: str = ""
    """REDIRECT's option as Istio spells it (`--to-ports` or `--to-port`)."""

    def __post_init__(self) -> None:
        kinds = TARGET_VALUES.get(self.kind)
        if kinds is None:
            raise TypeError(f"unknown target kind {self.kind!r}")
        _check_value(f"target {self.kind}", self.value, kinds)
        if self.mark is not None:
            _check_value(f"target {self.kind} mark", self.mark, (Mark,))
        if self.spelling not in REDIRECT_SPELLINGS:
            raise TypeError(f"target {self.kind}: unknown spelling {self.spelling!r}")


@dataclass(frozen=True)
class Rule:
    table: TableName
    chain: ChainName
    matches: tuple[Match, ...]
    target: Target
    insert_at: int | None = None
    """None appends; N inserts at position N (1-based), as `-I CHAIN N`."""

    def __post_init__(self) -> None:
        if self.table not in ("mangle", "nat", "raw"):
            raise TypeError(f"unknown table {self.table!r}")
        _check_value("a rule's chain", self.chain, (ChainName,))
        if not all(isinstance(m, Match) for m in self.matches):
            raise TypeError("a rule's matches must be Match objects")
        if not isinstance(self.target, Target):
            raise TypeError("a rule's target must be a Target")
        if self.insert_at is not None and (
            not isinstance(self.insert_at, int) or not 1 <= self.insert_at <= 0xFFFF
        ):
            raise TypeError(f"insert position {self.insert_at!r} out of range")


@dataclass(frozen=True)
class TableRules:
    """One table of one family: chains to create (in order) and the rule operations in order."""

    name: TableName
    chains: tuple[ChainName, ...]
    rules: tuple[Rule, ...]

    def __post_init__(self) -> None:
        for chain in self.chains:
            _check_value("a table's chain", chain, (ChainName,))

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
        chains: list[ChainName] = []
        for rule in in_table:
            if rule.chain not in BUILTIN_CHAINS and rule.chain not in chains:
                chains.append(rule.chain)
        for chain in _jump_targets(in_table):
            if chain not in chains:
                chains.append(chain)
        tables.append(TableRules(name=name, chains=tuple(chains), rules=tuple(in_table)))
    return tuple(tables)


def _jump_targets(rules: Iterable[Rule]) -> list[ChainName]:
    return [
        ChainName(rule.target.value)
        for rule in rules
        if rule.target.kind == "jump"
        and rule.target.value not in VERDICTS
        and rule.target.value not in BUILTIN_CHAINS
    ]


NFT_EXPR = re.compile(r"[A-Za-z0-9_.:/,@{}!=&|<> -]{1,8192}")
"""What an nft rule expression of ours is made of: words of this code and tokens, one space
apart. No quote, `;`, `#`, `\\`, `$`, line break or other control character: nothing that could
end the rule, start another command, a comment, a string or an `include`."""
NFT_CHAIN = re.compile(r"[a-z][a-z-]{0,30}")


def check_nft_rule(chain: str, expr: str) -> None:
    """Raise TypeError unless `chain` and `expr` are made only of what our nft rules use."""
    if not NFT_CHAIN.fullmatch(chain):
        raise TypeError(f"nft chain {chain!r} is not one of ours")
    if not NFT_EXPR.fullmatch(expr):
        raise TypeError(f"nft rule {expr[:80]!r} has a character no rule of ours has")


def is_our_chain(chain: str) -> bool:
    return chain.startswith(CHAIN_PREFIX)
