"""Apply rules as native nftables tables with one `nft -f` transaction inside the namespace.

Sidecar pods get Istio's native nftables rules (`apply_native`): the `inet istio-proxy-*`
tables exactly as Istio's `--native-nftables` writes them, so `nft list ruleset` in the pod
equals what Istio's own commands give. Our tables are declared, deleted and written anew in the
same transaction, so the switch is atomic and applying twice leaves one copy; tables of other
software are never named. `former_tables_script` deletes the `ip`/`ip6 istio-proxy-*` tables an
earlier version wrote for ambient pods (agent.rules.ambient.nft_apply runs it on every apply).
"""

from __future__ import annotations

import functools
import re
import subprocess

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules import tool_output
from agent.rules.render_nft import TABLE_PREFIX, render_native
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import TABLE_ORDER

FORMER_TABLES = ("mangle", "nat", "raw")
NATIVE_TABLES = tuple(f"inet {TABLE_PREFIX}{t}" for t in TABLE_ORDER)
COUNTERS = re.compile(r"\bcounter packets \d+ bytes \d+")


def native_script(config: CaptureConfig | None) -> str:
    """Drop our inet tables (declared first so the delete is valid when absent), then Istio's
    commands for `config`: tables Istio leaves out this time must not linger from last time."""
    return drop_tables(NATIVE_TABLES) + (render_native(config) if config is not None else "")


def remove_all(netns_path: str) -> None:
    """Remove every table of ours (inet, and the former ip/ip6 ones) in one transaction."""
    nft(netns_path, ["-f", "-"], native_script(None) + former_tables_script())


def apply_native(netns_path: str, config: CaptureConfig | None) -> None:
    """Program Istio's native nftables rules for a sidecar (None: remove them)."""
    nft(netns_path, ["-f", "-"], native_script(config))


def list_native(netns_path: str) -> str:
    """Our inet tables as `nft list` prints them, counters stripped, in Istio's table order."""
    listed = nft(netns_path, ["list", "tables", "inet"])
    present = {line.split()[2] for line in listed.splitlines() if line.startswith("table inet ")}
    out = [
        nft(netns_path, ["list", "table", *t.split()])
        for t in NATIVE_TABLES
        if t.split()[1] in present
    ]
    return COUNTERS.sub("counter", "".join(out))


def present_native(netns_path: str, config: CaptureConfig) -> bool:
    """Are exactly Istio's rules for `config` in our inet tables?"""
    return normalize(list_native(netns_path)) == normalize(expected_listing(render_native(config)))


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
            f"{family} {TABLE_PREFIX}{table}" for family in ("ip", "ip6") for table in FORMER_TABLES
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
