"""Apply rules with `iptables-restore --noflush` (legacy or nft variant) inside a namespace.

One restore per family: for each table, our chains are declared (which creates or empties
them), our old rules in built-in chains are deleted, the new rules are added, chains we no longer
use are deleted, then COMMIT: each table changes in one step, rules of other software stay.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules import tool_output
from agent.rules.model import Family, RuleSet, TableRules
from agent.rules.ownership import OUR_TABLES, SIDECAR, Ownership, builtin
from agent.rules.render_restore import rule_line
from agent.rules.render_save import parse_save, save_tables

Variant = str  # "legacy" or "nft"
Variants = Variant | Mapping[Family, Variant]
"""One variant for both families, or one per family (Istio chooses per family)."""


def variant_of(variants: Variants, family: Family) -> Variant:
    return variants if isinstance(variants, str) else variants[family]


def binary(variant: Variant, family: Family, tool: str) -> str:
    """e.g. ("nft", 6, "restore") -> ip6tables-nft-restore."""
    prefix = "iptables" if family == 4 else "ip6tables"
    return f"{prefix}-{variant}-{tool}" if tool else f"{prefix}-{variant}"


def run(netns_path: str, argv: list[str], stdin: str = "", *, writes: bool = False) -> str:
    """Run a command inside the namespace; its failure names the command and summarizes its
    error output (logged in full). `writes`: it writes rules (as the namespace's owner)."""

    try:
        done = run_command(netns_path, argv, stdin, as_owner=writes)
    except FileNotFoundError as e:
        raise RedirectError(f"{argv[0]}: not installed ({e.strerror})") from e
    if done.returncode != 0:
        raise tool_output.failed(" ".join(argv), netns_path, done.returncode, done.stderr)
    return done.stdout


State = dict[str, dict[str, list[str]]]
"""table -> chain -> `-A` lines, as iptables-save prints them."""


def read_state(netns_path: str, variant: Variant, family: Family) -> State:
    return parse_save(run(netns_path, [binary(variant, family, "save")]))


def apply(
    netns_path: str,
    ruleset: RuleSet | None,
    variant: Variants,
    *,
    empty: Collection[Family] = (),
    owner: Ownership = SIDECAR,
) -> None:
    """Replace our rules (all families) with `ruleset`; None removes them. `empty`: families
    known to hold none of our tables (agent.netns.look), whose state need not be read.
    `owner`: which chains and rules are ours to replace."""
    for family in (4, 6):
        fam: Family = 4 if family == 4 else 6
        apply_family(
            netns_path,
            ruleset,
            variant_of(variant, fam),
            fam,
            known_empty=fam in empty,
            owner=owner,
        )


def apply_family(
    netns_path: str,
    ruleset: RuleSet | None,
    variant: Variant,
    fam: Family,
    *,
    known_empty: bool = False,
    owner: Ownership = SIDECAR,
) -> None:
    tables = ruleset.family(fam) if ruleset is not None else ()
    if known_empty:
        state: State | None = {}
    else:
        state = _state_or_none(netns_path, variant, fam, needed=bool(tables))
    if state is None:
        return
    script = restore_script(state, tables, owner)
    if script:
        run(
            netns_path,
            [binary(variant, fam, "restore"), "--noflush", "--wait"],
            script,
            writes=True,
        )


def restore_script(
    state: dict[str, dict[str, list[str]]],
    tables: tuple[TableRules, ...],
    owner: Ownership = SIDECAR,
) -> str:
    wanted: dict[str, TableRules] = {t.name: t for t in tables}
    lines: list[str] = []
    for name in sorted(set(wanted) | set(OUR_TABLES)):
        chains = state.get(name, {})
        old_chains = [c for c in chains if owner.chain(c)]
        old_rules = [
            line
            for chain, rules in chains.items()
            if builtin(chain)
            for line in rules
            if owner.save_line(name, line)
        ]
        new = wanted.get(name)
        if new is None and not old_chains and not old_rules:
            continue
        new_chains = list(new.chains) if new else []
        lines.append(f"*{name}")
        lines.extend(
            f":{c} - [0:0]" for c in new_chains + [c for c in old_chains if c not in new_chains]
        )
        lines.extend("-D" + line[2:] for line in old_rules)
        if new:
            lines.extend(rule_line(rule) for rule in new.rules)
        lines.extend(f"-X {c}" for c in old_chains if c not in new_chains)
        lines.append("COMMIT")
    return "".join(line + "\n" for line in lines)


def ours(state: State, owner: Ownership = SIDECAR) -> State:
    """Only our chains and our rules in built-in chains, per table (for comparisons)."""
    out: dict[str, dict[str, list[str]]] = {}
    for table, chains in state.items():
        if table not in OUR_TABLES:
            continue
        kept: dict[str, list[str]] = {}
        for chain, rules in chains.items():
            if owner.chain(chain):
                kept[chain] = list(rules)
            elif builtin(chain):
                mine = [line for line in rules if owner.save_line(table, line)]
                if mine:
                    kept[chain] = mine
        if kept:
            out[table] = kept
    return out


def expected(
    tables: tuple[TableRules, ...], family: Family, owner: Ownership = SIDECAR
) -> dict[str, dict[str, list[str]]]:
    """What `ours(read_state(...))` must equal once `tables` are applied."""
    out: dict[str, dict[str, list[str]]] = {}
    for table, chains in save_tables(tables, family=family).items():
        kept = {c: r for c, r in chains.items() if owner.chain(c) or r}
        if kept:
            out[table] = kept
    return out


def present(
    netns_path: str,
    ruleset: RuleSet,
    variant: Variants,
    *,
    empty: Collection[Family] = (),
    owner: Ownership = SIDECAR,
) -> bool:
    for family in (4, 6):
        fam: Family = 4 if family == 4 else 6
        want = expected(ruleset.family(fam), fam, owner)
        if fam in empty:
            state: State | None = {}
        else:
            state = _state_or_none(netns_path, variant_of(variant, fam), fam, needed=bool(want))
        if (ours(state, owner) if state is not None else {}) != want:
            return False
    return True


def _state_or_none(netns_path: str, variant: Variant, fam: Family, *, needed: bool) -> State | None:
    """The family's state; None when it cannot be read and we have nothing to put there
    (a node with IPv6 switched off has no ip6tables tables at all)."""
    try:
        return read_state(netns_path, variant, fam)
    except RedirectError:
        if needed:
            raise
        return None
