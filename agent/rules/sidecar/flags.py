"""Istio's `istio-iptables` flags and environment variables, parsed into a CaptureConfig.

Each flag is declared once in FLAGS with its short name, environment variables and default.
Precedence is Istio's: command line > additional env var > primary env var > default. Syntax is
that of Go's pflag: `--name=value`, `--name value`, `-s value`, `-s=value`, `-svalue`, and a
bare `--bool-flag` meaning true.
"""

from __future__ import annotations

import logging
import pwd
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from agent import constants
from agent.errors import ConfigError
from agent.podinput.grammar import parse_bool
from agent.podinput.tokens import Address, Cidr
from agent.rules.sidecar import capture as cfg
from agent.rules.sidecar.capture import WILDCARD, CaptureConfig

log = logging.getLogger(__name__)

FlagKind = Literal["str", "bool", "uint16", "duration"]
T = TypeVar("T")


@dataclass(frozen=True)
class Flag:
    name: str
    short: str | None
    envs: tuple[str, ...]
    """Primary env var first, then the additional one (which wins over the primary)."""
    kind: FlagKind
    default: str


def _env(name: str) -> tuple[str, ...]:
    return (name.upper().replace("-", "_"),)


FLAGS: tuple[Flag, ...] = (
    Flag("envoy-port", "p", (), "str", constants.PROXY_OUTBOUND_PORT),
    Flag(
        "inbound-capture-port",
        "z",
        _env("inbound-capture-port"),
        "str",
        constants.PROXY_INBOUND_CAPTURE_PORT,
    ),
    Flag(
        "inbound-tunnel-port",
        "e",
        _env("inbound-tunnel-port"),
        "str",
        constants.PROXY_INBOUND_TUNNEL_PORT,
    ),
    Flag("proxy-uid", "u", _env("proxy-uid"), "str", ""),
    Flag("proxy-gid", "g", _env("proxy-gid"), "str", ""),
    Flag(
        "istio-inbound-interception-mode", "m", _env("istio-inbound-interception-mode"), "str", ""
    ),
    Flag("istio-inbound-ports", "b", _env("istio-inbound-ports"), "str", ""),
    Flag("istio-local-exclude-ports", "d", _env("istio-local-exclude-ports"), "str", ""),
    Flag("istio-exclude-interfaces", "c", _env("istio-exclude-interfaces"), "str", ""),
    Flag("istio-service-cidr", "i", _env("istio-service-cidr"), "str", ""),
    Flag("istio-service-exclude-cidr", "x", _env("istio-service-exclude-cidr"), "str", ""),
    Flag("istio-outbound-ports", "q", _env("istio-outbound-ports"), "str", ""),
    Flag(
        "istio-local-outbound-ports-exclude",
        "o",
        _env("istio-local-outbound-ports-exclude"),
        "str",
        "",
    ),
    Flag("kube-virt-interfaces", "k", _env("kube-virt-interfaces"), "str", ""),
    Flag(
        "istio-inbound-tproxy-mark",
        "t",
        _env("istio-inbound-tproxy-mark"),
        "str",
        constants.TPROXY_MARK,
    ),
    Flag(
        "istio-inbound-tproxy-route-table",
        "r",
        _env("istio-inbound-tproxy-route-table"),
        "str",
        constants.TPROXY_ROUTE_TABLE,
    ),
    Flag("dry-run", "n", _env("dry-run"), "bool", "false"),
    Flag(
        "iptables-probe-port",
        None,
        _env("iptables-probe-port"),
        "uint16",
        constants.IPTABLES_PROBE_PORT,
    ),
    Flag("probe-timeout", None, _env("probe-timeout"), "duration", "5s"),
    Flag("skip-rule-apply", None, _env("skip-rule-apply"), "bool", "false"),
    Flag("run-validation", None, _env("run-validation"), "bool", "false"),
    Flag("redirect-dns", None, ("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"), "bool", "false"),
    Flag("drop-invalid", None, ("DROP_INVALID", "INVALID_DROP"), "bool", "false"),
    Flag("dual-stack", None, ("DUAL_STACK", "ISTIO_DUAL_STACK"), "bool", "false"),
    Flag("capture-all-dns", None, _env("capture-all-dns"), "bool", "false"),
    Flag("network-namespace", None, _env("network-namespace"), "str", ""),
    Flag("cni-mode", None, _env("cni-mode"), "bool", "false"),
    Flag("reconcile", None, _env("reconcile"), "bool", "false"),
    Flag("cleanup-only", None, _env("cleanup-only"), "bool", "false"),
    Flag("force-apply", None, _env("force-apply"), "bool", "false"),
    Flag("native-nftables", None, _env("native-nftables"), "bool", "false"),
    Flag("force-iptables-binary", None, _env("force-iptables-binary"), "str", ""),
)
"""istio-iptables' flags (tools/istio-iptables/pkg/cmd/root.go)."""

HOST_FLAGS: tuple[Flag, ...] = (
    Flag("ipv6", None, (), "str", ""),
    Flag("dns-servers", None, (), "str", ""),
)
"""The two settings Istio detects on the host; empty `--ipv6` means detect here."""

_DURATION = re.compile(r"^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)$")


@dataclass(frozen=True)
class ParsedFlags:
    values: dict[str, str]
    """Effective raw value of every flag, by long name."""
    given: frozenset[str]
    """Flags that appeared on the command line."""


def parse_flags(
    argv: Sequence[str], flags: Sequence[Flag], environ: Mapping[str, str]
) -> ParsedFlags:
    """Parse pflag-style arguments; raises ConfigError naming the flag or variable."""
    by_long = {f.name: f for f in flags}
    by_short = {f.short: f for f in flags if f.short}
    values = {f.name: _from_env(f, environ) for f in flags}
    given: set[str] = set()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            if i < len(args):
                raise ConfigError(f"unexpected argument {args[i]!r}")
            break
        if arg.startswith("--"):
            name, eq, inline = arg[2:].partition("=")
            flag = by_long.get(name)
            shown = f"--{name}"
        elif arg.startswith("-") and len(arg) > 1:
            flag = by_short.get(arg[1])
            shown = f"-{arg[1]}"
            rest = arg[2:]
            eq = "=" if rest else ""
            # pflag: `-s=v` is v, but a bare `-s=` is the value "=" (its `-svalue` form).
            inline = rest[1:] if rest.startswith("=") and len(rest) > 1 else rest
        else:
            raise ConfigError(f"unexpected argument {arg!r} (flags only)")
        if flag is None:
            raise ConfigError(f"unknown flag {shown}")
        if not eq:
            if flag.kind == "bool":
                inline = "true"
            elif i < len(args):
                inline = args[i]
                i += 1
            else:
                raise ConfigError(f"flag {shown} needs a value")
        values[flag.name] = _check(flag, inline, where=f"flag {shown}")
        given.add(flag.name)
    return ParsedFlags(values=values, given=frozenset(given))


def _from_env(flag: Flag, environ: Mapping[str, str]) -> str:
    """The flag's value from its variables, set in Istio's order (primary, then additional).

    As in Istio (`_ = fs.Set(name, v)`), a value that does not parse is ignored and the flag
    keeps what it had; we say so on the log.
    """
    value = flag.default
    for var in flag.envs:
        if var in environ:
            try:
                value = _check(flag, environ[var], where=f"environment variable {var}")
            except ConfigError as e:
                log.warning("%s; ignored, as istio-iptables ignores it", e)
    return value


def _check(flag: Flag, value: str, *, where: str) -> str:
    try:
        if flag.kind == "bool":
            return "true" if parse_bool(value) else "false"
        if flag.kind == "uint16":
            number = _go_uint(value)
            if not 0 <= number <= 65535:
                raise ValueError(f"{value!r} is out of range 0-65535")
        if flag.kind == "duration" and not _DURATION.match(value):
            raise ValueError(f"{value!r} is not a duration like 5s or 1m30s")
    except ValueError as e:
        raise ConfigError(f"{where}: invalid value: {e}") from None
    return value


def _go_uint(text: str) -> int:
    """Go's strconv.ParseUint(text, 0, ...): 0x/0o/0b prefixes, a leading 0 for octal, and
    underscores between digits."""
    if len(text) > 1 and text[0] == "0" and (text[1].isdigit() or text[1] == "_"):
        return int("0o" + text[1:], 0)
    return int(text, 0)


@dataclass(frozen=True)
class RulesRequest:
    """What `rules` prints: a capture config, or nothing when Istio would program nothing."""

    config: CaptureConfig | None
    native_nftables: bool
    dual_stack: bool


def request_from_flags(
    parsed: ParsedFlags,
    environ: Mapping[str, str],
    *,
    ipv6: bool,
    dns_servers: Sequence[str],
) -> RulesRequest:
    """Turn parsed flags plus env-only settings into a CaptureConfig (Istio's Config)."""
    v = parsed.values
    flag_bool = {f.name: v[f.name] == "true" for f in FLAGS if f.kind == "bool"}
    _field("force-iptables-binary", v["force-iptables-binary"], _force_binary)
    if flag_bool["skip-rule-apply"] or flag_bool["cleanup-only"]:
        return RulesRequest(None, flag_bool["native-nftables"], flag_bool["dual-stack"])
    redirect_dns = flag_bool["redirect-dns"]
    capture_all = flag_bool["capture-all-dns"]
    servers_v4: tuple[Address, ...] = ()
    servers_v6: tuple[Address, ...] = ()
    if redirect_dns and not capture_all:
        servers_v4, servers_v6 = _field("dns-servers", list(dns_servers), cfg.split_dns_servers)
    # Istio fills the empty settings as strings: GID from UID, UID from $ENVOY_USER.
    uid_text = v["proxy-uid"] or _envoy_uid(environ)
    proxy_uids = _field("proxy-uid", uid_text, cfg.parse_ids)
    proxy_gids = _field("proxy-gid", v["proxy-gid"] or uid_text, cfg.parse_ids)
    # Read in Istio's order: the first refused flag is the one reported.
    ports = _port_fields(v)
    traffic = _traffic_fields(v)
    config = CaptureConfig(
        proxy_uids=proxy_uids,
        proxy_gids=proxy_gids,
        **ports,
        **traffic,
        redirect_dns=redirect_dns,
        capture_all_dns=capture_all,
        dns_servers_v4=servers_v4,
        dns_servers_v6=servers_v6,
        drop_invalid=flag_bool["drop-invalid"],
        enable_ipv6=ipv6,
        **_env_fields(environ),
    )
    return RulesRequest(config, flag_bool["native-nftables"], flag_bool["dual-stack"])


def _port_fields(v: Mapping[str, str]) -> dict[str, Any]:
    """The proxy's ports and the inbound interception settings."""
    return {
        "proxy_port": _field("envoy-port", v["envoy-port"], cfg.parse_port),
        "inbound_capture_port": _field(
            "inbound-capture-port", v["inbound-capture-port"], cfg.parse_port
        ),
        "inbound_tunnel_port": _field(
            "inbound-tunnel-port", v["inbound-tunnel-port"], cfg.parse_port
        ),
        "interception_mode": _field(
            "istio-inbound-interception-mode",
            v["istio-inbound-interception-mode"],
            cfg.parse_interception_mode,
        ),
        "tproxy_mark": _field(
            "istio-inbound-tproxy-mark", v["istio-inbound-tproxy-mark"], cfg.parse_mark
        ),
        "tproxy_route_table": _field(
            "istio-inbound-tproxy-route-table",
            v["istio-inbound-tproxy-route-table"],
            cfg.parse_route_table,
        ),
    }


def _traffic_fields(v: Mapping[str, str]) -> dict[str, Any]:
    """Which ports, CIDRs and interfaces are captured or left alone."""
    return {
        "inbound_ports_include": _field(
            "istio-inbound-ports", v["istio-inbound-ports"], _ports_or_wildcard
        ),
        "inbound_ports_set": v["istio-inbound-ports"] != "",
        "inbound_ports_exclude": _field(
            "istio-local-exclude-ports", v["istio-local-exclude-ports"], _ports
        ),
        "outbound_ports_include": _field("istio-outbound-ports", v["istio-outbound-ports"], _ports),
        "outbound_ports_exclude": _field(
            "istio-local-outbound-ports-exclude", v["istio-local-outbound-ports-exclude"], _ports
        ),
        "outbound_ip_ranges_include": _field(
            "istio-service-cidr", v["istio-service-cidr"], _cidrs_or_wildcard
        ),
        "outbound_ip_ranges_exclude": _field(
            "istio-service-exclude-cidr", v["istio-service-exclude-cidr"], _cidrs
        ),
        "exclude_interfaces": _field(
            "istio-exclude-interfaces", v["istio-exclude-interfaces"], cfg.parse_interfaces
        ),
        "reroute_virtual_interfaces": _field(
            "kube-virt-interfaces", v["kube-virt-interfaces"], cfg.parse_interfaces
        ),
    }


def _env_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings Istio reads from the environment only."""
    return {
        "owner_groups_include": _env_field(
            environ, "ISTIO_OUTBOUND_OWNER_GROUPS", "*", _groups_include
        ),
        "owner_groups_exclude": _env_field(
            environ, "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "", cfg.parse_groups
        ),
        "host_ipv4_loopback_cidr": _env_field(
            environ, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/32", cfg.parse_loopback_cidr
        ),
    }


def _field(name: str, value: Any, parse: Callable[[Any], T]) -> T:
    try:
        return parse(value)
    except ValueError as e:
        raise ConfigError(f"flag --{name}: invalid value {value!r}: {e}") from None


def _env_field(environ: Mapping[str, str], var: str, default: str, parse: Callable[[str], T]) -> T:
    value = environ.get(var, default)
    try:
        return parse(value)
    except ValueError as e:
        raise ConfigError(f"environment variable {var}: invalid value {value!r}: {e}") from None


def _ports(value: object) -> tuple[cfg.PortValue, ...]:
    ports = cfg.parse_ports(str(value), allow_wildcard=False)
    assert ports != WILDCARD
    return ports


def _ports_or_wildcard(value: object) -> tuple[cfg.PortValue, ...] | cfg.Wildcard:
    return cfg.parse_ports(str(value), allow_wildcard=True)


def _cidrs(value: object) -> tuple[Cidr, ...]:
    cidrs = cfg.parse_cidrs(str(value), allow_wildcard=False)
    assert cidrs != WILDCARD
    return cidrs


def _cidrs_or_wildcard(value: object) -> tuple[Cidr, ...] | cfg.Wildcard:
    return cfg.parse_cidrs(str(value), allow_wildcard=True)


def _groups_include(value: str) -> tuple[cfg.GroupValue, ...] | cfg.Wildcard:
    if value == WILDCARD:
        return WILDCARD
    groups = cfg.parse_groups(value)
    if len(groups) > cfg.MAX_OWNER_GROUPS_INCLUDE:
        raise ValueError(
            f"at most {cfg.MAX_OWNER_GROUPS_INCLUDE} groups may be captured, got {len(groups)}"
        )
    return groups


def _force_binary(value: object) -> str:
    if value not in ("", "legacy", "nft"):
        raise ValueError("want '', 'legacy' or 'nft'")
    return str(value)


def _envoy_uid(environ: Mapping[str, str]) -> str:
    """Istio's default proxy UID: the UID of $ENVOY_USER (istio-proxy), else 1337."""
    try:
        return str(pwd.getpwnam(environ.get("ENVOY_USER", "istio-proxy")).pw_uid)
    except KeyError:
        return constants.PROXY_ID
