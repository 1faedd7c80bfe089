"""Apply rules as native nftables tables with one `nft -f` transaction inside the namespace.

Our tables (`istio-proxy-*` in families ip and ip6) are declared, deleted and written anew in
the same transaction, so the switch is atomic and applying twice leaves one copy; tables of
other software are never named.
"""

from __future__ import annotations

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules.model import RuleSet
from agent.rules.render_nft import TABLE_PREFIX, nft_family, render_table, table_name

FAMILIES = (4, 6)
TABLES = ("mangle", "nat", "raw")


def script(ruleset: RuleSet | None) -> str:
    lines: list[str] = []
    for family in FAMILIES:
        for table in TABLES:
            # Declaring first makes the delete valid whether or not the table exists.
            name = f"{nft_family(4 if family == 4 else 6)} {table_name(table)}"
            lines.append(f"table {name}\ndelete table {name}\n")
    if ruleset is not None:
        lines += [render_table(t, family=4) for t in ruleset.v4]
        lines += [render_table(t, family=6) for t in ruleset.v6]
    return "".join(lines)


def _nft(netns_path: str, argv: list[str], stdin: str = "") -> str:
    try:
        done = run_command(netns_path, ["nft", *argv], stdin)
    except FileNotFoundError as e:
        raise RedirectError(f"nft: not installed ({e.strerror})") from e
    if done.returncode != 0:
        raise RedirectError(f"nft {' '.join(argv)} in {netns_path}: {done.stderr.strip()[:500]}")
    return done.stdout


def apply(netns_path: str, ruleset: RuleSet | None) -> None:
    _nft(netns_path, ["-f", "-"], script(ruleset))


def list_ours(netns_path: str) -> str:
    """Our tables as `nft list` prints them, IPv4 then IPv6, in table-name order."""
    listed = _nft(netns_path, ["list", "tables"])
    present = {tuple(line.split()[1:3]) for line in listed.splitlines() if line.startswith("table")}
    out: list[str] = []
    for family in FAMILIES:
        fam = nft_family(4 if family == 4 else 6)
        for table in TABLES:
            if (fam, table_name(table)) in present:
                out.append(_nft(netns_path, ["list", "table", fam, table_name(table)]))
    return "".join(out)


def normalize(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def present(netns_path: str, ruleset: RuleSet) -> bool:
    want = [render_table(t, family=4) for t in ruleset.v4]
    want += [render_table(t, family=6) for t in ruleset.v6]
    return normalize(list_ours(netns_path)) == normalize("".join(want))


__all__ = ["TABLE_PREFIX", "apply", "list_ours", "present", "script"]
