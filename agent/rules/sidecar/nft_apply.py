"""Program a sidecar pod's native nftables rules with one `nft -f` transaction in its namespace.

The `inet istio-proxy-*` tables exactly as Istio's `--native-nftables` writes them, so `nft list
ruleset` in the pod equals what Istio's own commands give. Our tables are declared, deleted and
written anew in the same transaction, so the switch is atomic and applying twice leaves one
copy; tables of other software are never named.
"""

from __future__ import annotations

from agent.rules import nft as engine
from agent.rules.backend_nft import (
    drop_tables,
    expected_listing,
    former_tables_script,
    list_tables,
    nft,
    normalize,
)
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import render_native

NATIVE_TABLES = engine.table_names(engine.SIDECAR_PREFIX)


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
    return list_tables(netns_path, NATIVE_TABLES)


def present_native(netns_path: str, config: CaptureConfig) -> bool:
    """Are exactly Istio's rules for `config` in our inet tables?"""
    return normalize(list_native(netns_path)) == normalize(expected_listing(render_native(config)))
