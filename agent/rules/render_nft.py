"""Render Istio's native nftables rules as `nft -f` input.

Sidecar mode (`render_native`): Istio's own native nftables rules (agent.rules.sidecar.nft) as the
commands Istio's transaction prints, one a line: `add table inet istio-proxy-nat`, `flush table`,
the chains that have rules, then each rule (`add rule`, or `insert rule ... index N`).
Ambient mode has its own (agent.rules.ambient.nft).
"""

from __future__ import annotations

from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import BASE_CHAINS as NATIVE_BASE_CHAINS
from agent.rules.sidecar.nft import CHAINS, TABLE_ORDER, NftRule, build_native

TABLE_PREFIX = "istio-proxy-"


def render_native(config: CaptureConfig) -> str:
    """Istio's native nftables commands for a sidecar's capture config."""
    return native_commands(build_native(config))


def native_commands(rules: list[NftRule]) -> str:
    """The `nft -f` commands for Istio's rules, table by table, as Istio's transaction writes
    them: a table (and each chain) only when it holds a rule."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        mine = [rule for rule in rules if rule.table == table]
        if not mine:
            continue
        name = f"inet {TABLE_PREFIX}{table}"
        lines += [f"add table {name}", f"flush table {name}"]
        used = {rule.chain for rule in mine}
        for chain in (c for c in CHAINS[table] if c in used):
            base = NATIVE_BASE_CHAINS.get((table, chain))
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


def native_cleanup() -> str:
    """Istio's `--cleanup-only` in native mode: each table declared, then deleted."""
    lines: list[str] = []
    for table in TABLE_ORDER:
        name = f"inet {TABLE_PREFIX}{table}"
        lines += [f"add table {name}", f"delete table {name}"]
    return "".join(line + "\n" for line in lines)
