"""The in-pod policy routing that goes with ambient's rules (Istio's iptables_linux.go).

Replies on ztunnel's connections carry the connection mark 0x111/0xfff (restored by the mangle
rules); `ip rule fwmark 0x111/0xfff pref 32764 lookup 100` with `local default dev lo` in table
100 delivers them to ztunnel's socket in the pod. IPv6 gets the same when on, unless the pod's
loopback has IPv6 switched off (Istio skips it then too).
"""

from __future__ import annotations

from agent.netns import run_command, run_in_netns
from agent.rules import tool_output
from agent.rules.ambient.builder import INPOD_TPROXY_MARK, ROUTE_TABLE, RULE_PRIORITY

LO_DISABLE_IPV6 = "/proc/sys/net/ipv6/conf/lo/disable_ipv6"
RULE = ("fwmark", INPOD_TPROXY_MARK, "pref", RULE_PRIORITY, "lookup", ROUTE_TABLE)


def _ip(netns_path: str, *args: str) -> tuple[bool, str]:
    done = run_command(netns_path, ["ip", *args])
    return done.returncode == 0, done.stderr.strip()


def _families(netns_path: str, ipv6: bool) -> tuple[str, ...]:
    if ipv6 and _lo_has_ipv6(netns_path):
        return ("-4", "-6")
    return ("-4",)


def _lo_has_ipv6(netns_path: str) -> bool:
    def read() -> str:
        try:
            with open(LO_DISABLE_IPV6) as f:  # the sysctl of the thread's namespace
                return f.read().strip()
        except OSError:
            return "1"  # no IPv6 in this kernel or namespace

    return run_in_netns(netns_path, read) != "1"


def apply_routes(netns_path: str, *, ipv6: bool) -> None:
    """Add the rule (once: an existing one is kept) and the local route."""
    for fam in _families(netns_path, ipv6):
        ok, err = _ip(netns_path, fam, "rule", "add", *RULE)
        if not ok and "File exists" not in err:
            raise tool_output.failed(f"ip {fam} rule add {' '.join(RULE)}", netns_path, 1, err)
        args = (fam, "route", "replace", "local", "default", "dev", "lo", "table", ROUTE_TABLE)
        ok, err = _ip(netns_path, *args)
        if not ok:
            raise tool_output.failed(f"ip {' '.join(args)}", netns_path, 1, err)


def remove_routes(netns_path: str) -> None:
    """Undo apply_routes in both families; what is not there is fine."""
    for fam in ("-4", "-6"):
        while _ip(netns_path, fam, "rule", "del", *RULE)[0]:
            pass
        _ip(netns_path, fam, "route", "del", "local", "default", "dev", "lo", "table", ROUTE_TABLE)


def routes_present(netns_path: str, *, ipv6: bool) -> bool:
    for fam in _families(netns_path, ipv6):
        rules = run_command(netns_path, ["ip", fam, "rule", "list", "pref", RULE_PRIORITY]).stdout
        routes = run_command(
            netns_path, ["ip", fam, "route", "show", "table", ROUTE_TABLE, "type", "local"]
        ).stdout
        if f"fwmark {INPOD_TPROXY_MARK} lookup {ROUTE_TABLE}" not in rules:
            return False
        if "default dev lo" not in routes:
            return False
    return True
