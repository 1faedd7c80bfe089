"""What is in a namespace against what the agent would program there now, rule by rule.

`istio-cni-agent status POD` shows it. The backend is chosen as `program` would choose it now
(agent.rules.backends); python-iptables' rules are read through iptables-legacy-save, as
`present` reads them. Each rule is one line: `ipv4 nat -A ISTIO_OUTPUT ...` for the iptables
backends (`ipv4 nat :ISTIO_OUTPUT` for one of our chains), `inet istio-proxy-nat
ISTIO_OUTPUT: ...` for nftables, so a missing or an extra rule can be named. Lines come from the
namespace, where a pod holding NET_ADMIN can write anything: callers show them escaped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.errors import RedirectError
from agent.netns.look import NetnsLook
from agent.rules import backend_restore, backends
from agent.rules.backend_nft import normalize
from agent.rules.model import Family, RuleSet
from agent.rules.ownership import OUR_TABLES, Ownership

_FAMILIES: tuple[Family, ...] = (4, 6)


@dataclass(frozen=True)
class RulesDiff:
    """`missing`: rules the agent would program that are not there; `extra`: rules of ours
    there that it would not program; `reordered`: chains holding the right rules in another
    order (the first match wins, so the order matters)."""

    backend: str
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    reordered: tuple[str, ...] = ()

    @property
    def same(self) -> bool:
        return not (self.missing or self.extra or self.reordered)


NativeListings = Callable[[], tuple[str, str]]
"""(what `nft list` shows of our tables there, what it would show of the wanted commands)."""


def compare(
    netns_path: str,
    model: Callable[[], RuleSet],
    *,
    backend: str,
    owner: Ownership,
    native: NativeListings,
    seen: NetnsLook,
) -> RulesDiff:
    chosen = backends.choose(netns_path, backend, seen=seen)
    if chosen == "nftables":
        have_text, want_text = native()
        return _diff(chosen, _nft_lines(want_text), _nft_lines(have_text))
    if isinstance(chosen, str):  # python-iptables: legacy tables
        label, variants = chosen, backends.LEGACY_ONLY
    else:
        label, variants = chosen.label, chosen.variants()
    ruleset = model()
    want_lines: list[str] = []
    have_lines: list[str] = []
    for fam in _FAMILIES:
        want = backend_restore.expected(ruleset.family(fam), fam, owner)
        want_lines += _iptables_lines(fam, want)
        if seen.tables_absent(variants[fam], fam, OUR_TABLES):
            continue
        try:
            state = backend_restore.read_state(netns_path, variants[fam], fam)
        except RedirectError:
            if want:
                raise
            continue  # IPv6 off in the pod: no tables to read, none wanted
        have_lines += _iptables_lines(fam, backend_restore.ours(state, owner))
    return _diff(label, want_lines, have_lines)


def _iptables_lines(fam: Family, tables: dict[str, dict[str, list[str]]]) -> list[str]:
    prefix = f"ipv{fam}"
    out: list[str] = []
    for table, chains in sorted(tables.items()):
        for chain, rules in chains.items():
            out.append(f"{prefix} {table} :{chain}")
            out += [f"{prefix} {table} {rule}" for rule in rules]
    return out


def _nft_lines(listing: str) -> list[str]:
    """Each rule of an `nft list` output prefixed by its table and chain."""
    table = chain = ""
    out: list[str] = []
    for line in normalize(listing):
        if line.startswith("table "):
            table, chain = line.removeprefix("table ").removesuffix("{").strip(), ""
            out.append(table)
        elif line.startswith("chain "):
            chain = line.removeprefix("chain ").removesuffix("{").strip()
            out.append(f"{table} {chain}:")
        elif line != "}":
            out.append(f"{table} {chain}: {line}" if chain else f"{table}: {line}")
    return out


def _diff(chosen: str, want: list[str], have: list[str]) -> RulesDiff:
    wanted, had = collections.Counter(want), collections.Counter(have)
    missing = tuple(_in_order(want, wanted - had))
    extra = tuple(_in_order(have, had - wanted))
    reordered: tuple[str, ...] = ()
    if not missing and not extra:
        reordered = tuple(sorted(_containers(want) - _same_order(want, have)))
    return RulesDiff(chosen, missing, extra, reordered)


def _in_order(lines: Iterable[str], counts: collections.Counter[str]) -> list[str]:
    out: list[str] = []
    left = collections.Counter(counts)
    for line in lines:
        if left[line] > 0:
            out.append(line)
            left[line] -= 1
    return out


def _container(line: str) -> str:
    """The chain a line is in: `ipv4 nat ISTIO_OUTPUT`, `inet istio-proxy-nat ISTIO_OUTPUT`."""
    if ": " in line or line.endswith(":"):
        return line.split(":", 1)[0]
    parts = line.split()
    if len(parts) >= 4 and parts[2] == "-A":
        return " ".join((parts[0], parts[1], parts[3]))
    return " ".join(parts[:2])


def _is_rule(line: str) -> bool:
    """A rule, not a chain's or a table's declaration (whose order the tools choose)."""
    return " -A " in line or ": " in line


def _containers(lines: Iterable[str]) -> set[str]:
    return {_container(line) for line in lines if _is_rule(line)}


def _same_order(want: list[str], have: list[str]) -> set[str]:
    """Chains whose rules come in the same order in both."""
    by_want: dict[str, list[str]] = collections.defaultdict(list)
    by_have: dict[str, list[str]] = collections.defaultdict(list)
    for line in filter(_is_rule, want):
        by_want[_container(line)].append(line)
    for line in filter(_is_rule, have):
        by_have[_container(line)].append(line)
    return {c for c in by_want if by_want[c] == by_have.get(c)}
