"""`istio-cni-agent rules --ambient pod|host [FLAGS]`: print ambient mode's rules.

pod: Istio's in-pod redirection for the given options; host: the node-side probe SNAT rules.
Settings not given as flags come from the agent's config file (`ambient.*`), as the agent would
use them. Output is `iptables-restore` input, IPv4 tables then IPv6 tables; with `--format=nft`,
Istio's native nftables commands (`nft -f` input, one a line, as Istio's nftables mode writes
them). The host rules in that form match kubelet's UID: `--kubelet-uid`, else found in /proc.
"""

from __future__ import annotations

import sys
from typing import Final

from agent.config import DEFAULT_CONFIG_PATH, load_settings
from agent.errors import ConfigError, InvalidPodInputError, RedirectError, TokenError
from agent.podinput import pod as podinput
from agent.podinput.grammar import parse_bool
from agent.podinput.manifest import load_pod_manifest
from agent.podinput.tokens import Address, Id, InterfaceName
from agent.rules.ambient import nft
from agent.rules.ambient.builder import host_rules, pod_rules
from agent.rules.ambient.kubelet import kubelet_uid
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.ambient.overrides import rule_options_for
from agent.rules.render_restore import render

USAGE: Final = """\
usage: istio-cni-agent rules --ambient pod|host [--ipv6=true|false] [--redirect-dns=true|false]
           [--ingress] [--virtual-interfaces=A,B] [--dns-proxy=enabled|disabled]
           [--probe-snat=ADDR] [--probe-snat-v6=ADDR] [--format=restore|nft]
           [--kubelet-uid=UID] [--config FILE]
       istio-cni-agent rules --ambient pod --pod FILE [--ipv6=..] [--redirect-dns=..]
           [--probe-snat=ADDR] [--probe-snat-v6=ADDR] [--format=restore|nft] [--config FILE]

pod: the rules Istio programs inside an enrolled pod's network namespace; host: the node-side
rules that SNAT kubelet's probes to enrolled pods. Defaults: the config file's ambient settings.
--format=nft prints Istio's native nftables commands; its host rules match kubelet's UID
(--kubelet-uid, default: the UID of the kubelet process found in /proc).
With --pod, the pod's own settings (ambient.istio.io/bypass-inbound-capture,
ambient.istio.io/dns-capture, istio.io/reroute-virtual-interfaces) come from the Pod manifest
FILE (YAML or JSON), read by the same parser the agent uses: the output is what the agent
programs in that pod once it is enrolled. A value the agent refuses exits 1 with a message
naming the annotation; nothing is printed on stdout then.
"""

VALUE_FLAGS: Final = (
    "ambient",
    "ipv6",
    "redirect-dns",
    "virtual-interfaces",
    "dns-proxy",
    "probe-snat",
    "probe-snat-v6",
    "format",
    "kubelet-uid",
    "config",
    "pod",
)
POD_LEVEL_FLAGS: Final = ("ingress", "virtual-interfaces", "dns-proxy")
"""Flags whose settings a pod manifest gives itself: not taken together with --pod."""
BOOL_FLAGS: Final = ("ingress",)


def wants_ambient(argv: list[str]) -> bool:
    return any(arg == "--ambient" or arg.startswith("--ambient=") for arg in argv)


def parse(argv: list[str]) -> dict[str, str]:
    """`--name=value`, `--name value`, and `--ingress` alone; unknown flags are errors."""
    out: dict[str, str] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}")
        name, eq, value = arg[2:].partition("=")
        if name in BOOL_FLAGS:
            out[name] = value if eq else "true"
        elif name in VALUE_FLAGS:
            if not eq:
                if not args:
                    raise ConfigError(f"flag --{name} needs a value")
                value = args.pop(0)
            out[name] = value
        else:
            raise ConfigError(f"flag --{name}: unknown with --ambient")
    return out


def options_from_flags(flags: dict[str, str]) -> PodRuleOptions:
    settings = load_settings(flags.get("config", DEFAULT_CONFIG_PATH)).ambient
    dns_proxy = flags.get("dns-proxy") or None
    if dns_proxy not in (None, "enabled", "disabled"):
        raise ConfigError(
            f"flag --dns-proxy: invalid value {dns_proxy!r}: want enabled or disabled"
        )
    try:
        interfaces = tuple(
            InterfaceName(i.strip())
            for i in flags.get("virtual-interfaces", "").split(",")
            if i.strip()
        )
    except TokenError as e:
        raise ConfigError(f"flag --virtual-interfaces: invalid value: {e}") from None
    return PodRuleOptions(
        ipv6=_bool(flags, "ipv6", settings.ipv6),
        redirect_dns=_bool(flags, "redirect-dns", settings.dnsCapture),
        dns_proxy="enabled" if dns_proxy == "enabled" else "disabled" if dns_proxy else None,
        ingress=_bool(flags, "ingress", False),
        virtual_interfaces=interfaces,
        probe_snat=_address(flags, "probe-snat", settings.hostProbeSnatAddress, 4),
        probe_snat_v6=_address(flags, "probe-snat-v6", settings.hostProbeSnatAddressV6, 6),
    )


def _bool(flags: dict[str, str], name: str, default: bool) -> bool:
    if name not in flags:
        return default
    try:
        return parse_bool(flags[name])
    except ValueError as e:
        raise ConfigError(f"flag --{name}: invalid value: {e}") from None


def _address(flags: dict[str, str], name: str, default: str, version: int) -> Address:
    value = flags.get(name, default)
    try:
        address = Address(value)
    except TokenError:
        address = None
    if address is None or address.version != version:
        raise ConfigError(f"flag --{name}: invalid value {value!r}: want an IPv{version} address")
    return address


def pod_options(flags: dict[str, str]) -> PodRuleOptions:
    """The options the agent derives for the pod manifest in --pod (node-wide ones from the
    flags and the config file), through agent.podinput as the agent reads a pod."""
    given = sorted(name for name in POD_LEVEL_FLAGS if name in flags)
    if given:
        raise ConfigError("--pod takes its settings from the pod; drop --" + ", --".join(given))
    pod = load_pod_manifest(flags["pod"])
    options = rule_options_for(options_from_flags(flags))(pod)
    podinput.pod_ips(pod)  # the agent refuses a pod whose IPs are not IPs
    return options


def main(command: str, argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv):
        sys.stdout.write(USAGE)
        return 0
    try:
        flags = parse(argv)
        target = flags.get("ambient", "")
        if target not in ("pod", "host"):
            raise ConfigError(f"flag --ambient: invalid value {target!r}: want pod or host")
        if "pod" in flags and target != "pod":
            raise ConfigError("flag --pod: only with --ambient pod")
        options = pod_options(flags) if "pod" in flags else options_from_flags(flags)
        fmt = flags.get("format", "restore")
        if fmt not in ("restore", "nft"):
            raise ConfigError(f"flag --format: invalid value {fmt!r}: want restore or nft")
        if fmt == "nft":
            sys.stdout.write(_native(target, options, flags))
            return 0
    except InvalidPodInputError as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 1
    except (ConfigError, OSError, RedirectError, ValueError) as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 2
    if target == "pod":
        ruleset = pod_rules(options)
    else:
        ruleset = host_rules(
            ipv6=options.ipv6, probe_snat=options.probe_snat, probe_snat_v6=options.probe_snat_v6
        )
    sys.stdout.write(render(ruleset))
    return 0


def _native(target: str, options: PodRuleOptions, flags: dict[str, str]) -> str:
    """Istio's nftables commands for the pod or the node."""
    if target == "pod":
        return nft.render_pod(options)
    uid = flags.get("kubelet-uid") or kubelet_uid()
    try:
        kubelet = Id(uid)
    except TokenError:
        raise ConfigError(
            f"flag --kubelet-uid: invalid value {uid!r}: want a numeric UID"
        ) from None
    return nft.render_host(
        ipv6=options.ipv6,
        probe_snat=options.probe_snat,
        probe_snat_v6=options.probe_snat_v6,
        kubelet_uid=kubelet,
    )
