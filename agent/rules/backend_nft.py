"""Run `nft` inside a namespace and compare what it lists: the nftables backend of both modes.

Each mode writes its tables in one transaction (agent.rules.sidecar.nft_apply,
agent.rules.ambient.nft_apply); what is in place is compared with what `nft` itself lists for the
wanted commands (`expected_listing`). `former_tables_script` deletes the `ip`/`ip6
istio-proxy-*` tables an earlier version wrote for ambient pods (both modes run it).
"""

from __future__ import annotations

import functools
import re
import subprocess

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules import tool_output
from agent.rules.nft import SIDECAR_PREFIX

FORMER_TABLES = ("mangle", "nat", "raw")
COUNTERS = re.compile(r"\bcounter packets \d+ bytes \d+")


def list_tables(netns_path: str, tables: tuple[str, ...], *, terse: bool = False) -> str:
    """Those of `tables` ("inet name") that exist, as `nft list` prints them (`terse`: without
    set elements), counters stripped, in the order given."""
    listed = nft(netns_path, ["list", "tables", "inet"])
    present = {line.split()[2] for line in listed.splitlines() if line.startswith("table inet ")}
    flags = ["-t"] if terse else []
    out = [
        nft(netns_path, [*flags, "list", "table", *t.split()])
        for t in tables
        if t.split()[1] in present
    ]
    return COUNTERS.sub("counter", "".join(out))


@functools.lru_cache(maxsize=64)
def expected_listing(commands: str) -> str:
    """How nft lists `commands`: applied in a throwaway network namespace (nft rewrites rules
    when it lists them, and only nft knows exactly how)."""
    done = subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", "nft -f - && nft list ruleset"],
        input=commands,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise tool_output.failed(
            "nft -f - (expected rules)", "a scratch netns", done.returncode, done.stderr
        )
    return COUNTERS.sub("counter", done.stdout)


def former_tables_script() -> str:
    """Delete the `ip`/`ip6 istio-proxy-{mangle,nat,raw}` tables of an earlier version's ambient
    rules."""
    return drop_tables(
        tuple(
            f"{family} {SIDECAR_PREFIX}{table}"
            for family in ("ip", "ip6")
            for table in FORMER_TABLES
        )
    )


def drop_tables(tables: tuple[str, ...]) -> str:
    """`nft -f` lines deleting `tables` ("family name"): declaring each first makes the delete
    valid whether or not it exists."""
    return "".join(f"add table {t}\ndelete table {t}\n" for t in tables)


def nft(netns_path: str, argv: list[str], stdin: str = "") -> str:
    """Run `nft` inside the namespace; a RedirectError naming the command when it fails."""
    try:
        done = run_command(netns_path, ["nft", *argv], stdin)
    except FileNotFoundError as e:
        raise RedirectError(f"nft: not installed ({e.strerror})") from e
    if done.returncode != 0:
        raise tool_output.failed(f"nft {' '.join(argv)}", netns_path, done.returncode, done.stderr)
    return done.stdout


def normalize(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]
