"""Routing set-up that goes with the rules: TPROXY policy routing and the ::6 inbound address.

TPROXY marks inbound packets; `ip rule fwmark MARK lookup TABLE` plus a `local default` route
in that table deliver them to the local socket. With IPv6, Istio's inbound passthrough binds
::6, which must be on lo (IPv6 lo only holds ::1 by default).
"""

from __future__ import annotations

from agent import constants
from agent.netns import run_command
from agent.rules import tool_output
from agent.rules.sidecar.capture import CaptureConfig

PASSTHROUGH_V6 = "::6/128"


def _ip(netns_path: str, *args: str, check: bool = True) -> bool:
    done = run_command(netns_path, ["ip", *args])
    if check and done.returncode != 0:
        raise tool_output.failed(f"ip {' '.join(args)}", netns_path, done.returncode, done.stderr)
    return done.returncode == 0


def _families(ipv6: bool) -> tuple[str, ...]:
    return ("-4", "-6") if ipv6 else ("-4",)


def apply_routes(netns_path: str, config: CaptureConfig) -> None:
    if config.enable_ipv6:
        _ip(netns_path, "-6", "addr", "replace", PASSTHROUGH_V6, "dev", "lo")
    if not config.tproxy:
        return
    mark, table = config.tproxy_mark, config.tproxy_route_table
    # The local route needs lo up; every pod has it up, a bare namespace may not.
    _ip(netns_path, "link", "set", "lo", "up")
    for fam in _families(config.enable_ipv6):
        # Delete first so applying twice leaves one rule.
        while _ip(netns_path, fam, "rule", "del", "fwmark", mark, "lookup", table, check=False):
            pass
        _ip(netns_path, fam, "rule", "add", "fwmark", mark, "lookup", table)
        _ip(netns_path, fam, "route", "replace", "local", "default", "dev", "lo", "table", table)


def remove_routes(
    netns_path: str,
    *,
    mark: str = constants.TPROXY_MARK,
    table: str = constants.TPROXY_ROUTE_TABLE,
) -> None:
    """Undo apply_routes for the given TPROXY mark and table (Istio's defaults)."""
    for fam in ("-4", "-6"):
        while _ip(netns_path, fam, "rule", "del", "fwmark", mark, "lookup", table, check=False):
            pass
        _ip(netns_path, fam, "route", "flush", "table", table, check=False)
