"""`istio-cni-agent rules` in sidecar mode: print, not apply, the rules for flags or a pod."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from agent.config import DEFAULT_CONFIG_PATH, load_settings
from agent.errors import ConfigError, InvalidPodInputError
from agent.netns.look import local_addresses
from agent.podinput.grammar import parse_bool
from agent.podinput.manifest import load_pod_manifest
from agent.rules.render_restore import render
from agent.rules.sidecar import hostfacts
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.flags import (
    FLAGS,
    HOST_FLAGS,
    Flag,
    ParsedFlags,
    parse_flags,
    request_from_flags,
)
from agent.rules.sidecar.pod import (
    capture_config_for_pod,
    decide,
    ipv6_for_pod,
    pod_ips,
)

CLI_FLAGS: tuple[Flag, ...] = (
    Flag("config", None, (), "str", DEFAULT_CONFIG_PATH),
    Flag("format", None, (), "str", ""),
    Flag("pod", None, (), "str", ""),
)

USAGE = """\
usage: istio-cni-agent rules [istio-iptables FLAGS] [--ipv6=true|false] [--dns-servers=A,B]
                             [--format restore|nft] [--config FILE]
       istio-cni-agent rules --pod FILE [--ipv6=true|false] [--format ..] [--config FILE]

Prints the iptables-restore input (IPv4 tables, then IPv6) or, with --format nft, the
`nft -f` input. FLAGS are those of Istio's istio-iptables (long and short names, same
environment variables). Without --ipv6 / --dns-servers they are detected here as Istio does.
With --pod the settings are the pod's, decided as Istio's CNI plugin decides them: IPv6
rules from the proxy's ISTIO_DUAL_STACK and the pod's status.podIPs (this host's addresses when
the manifest has none) unless --ipv6 says; DNS capture takes all port-53 traffic, so
--dns-servers is ignored. A pod that would not be redirected prints nothing and its reason on
stderr.
"""


def main(command: str, argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    if any(arg in ("-h", "--help") for arg in argv):
        sys.stdout.write(USAGE)
        return 0
    try:
        return _run(argv, env)
    except InvalidPodInputError as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 1
    except (ConfigError, ValueError, OSError) as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 2


def _run(argv: list[str], environ: Mapping[str, str]) -> int:
    parsed = parse_flags(argv, FLAGS + HOST_FLAGS + CLI_FLAGS, environ)
    values = parsed.values
    fmt = values["format"]
    if fmt not in ("", "restore", "nft"):
        raise ConfigError(f"flag --format: invalid value {fmt!r}: want restore or nft")
    settings = load_settings(values["config"])
    native = False
    config: CaptureConfig | None
    if values["pod"]:
        _refuse_istio_flags(parsed)
        pod = load_pod_manifest(values["pod"])
        decision = decide(pod, exclude_namespaces=settings.excludeNamespaces)
        if not decision.redirect:
            sys.stderr.write(f"not redirected: {decision.reason}\n")
            return 0
        config = _pod_config(pod, parsed)
    else:
        dual_stack = parse_bool(values["dual-stack"])
        ipv6 = _ipv6(values["ipv6"], dual_stack=dual_stack)
        servers = _dns_servers(values["dns-servers"], given="dns-servers" in parsed.given)
        request = request_from_flags(parsed, environ, ipv6=ipv6, dns_servers=servers)
        config, native = request.config, request.native_nftables
    nft = fmt == "nft" or (fmt == "" and native)
    if config is None:
        if nft and _cleanup_only(parsed):
            from agent.rules.sidecar.nft import native_cleanup

            sys.stdout.write(native_cleanup())  # Istio's native mode deletes its tables
            return 0
        sys.stderr.write("no rules: rule generation is switched off by the flags\n")
        return 0
    if nft:
        from agent.rules.sidecar.nft import render_native

        sys.stdout.write(render_native(config))
    else:
        sys.stdout.write(render(build(config)))
    return 0


def _cleanup_only(parsed: ParsedFlags) -> bool:
    """--cleanup-only without --skip-rule-apply (which wins: Istio then does nothing)."""
    values = parsed.values
    return (
        "cleanup-only" in values
        and values["cleanup-only"] == "true"
        and (values.get("skip-rule-apply") != "true")
    )


def _pod_config(pod: Mapping[str, Any], parsed: ParsedFlags) -> CaptureConfig:
    """The pod's capture settings, decided as Istio's plugin decides them.

    IPv6: `--ipv6` when given; else Istio's rule (ISTIO_DUAL_STACK on the pod's proxy, the
    pod's addresses) on the manifest's status.podIPs, or on this host's addresses when the
    manifest has none. DNS resolvers are never read: the plugin captures all port-53 traffic.
    """
    if "ipv6" in parsed.given:
        ipv6 = _ipv6(parsed.values["ipv6"], dual_stack=False)
    else:
        addresses = pod_ips(pod) or local_addresses()
        ipv6 = ipv6_for_pod(pod, addresses)
    return capture_config_for_pod(pod, ipv6=ipv6)


def _refuse_istio_flags(parsed: ParsedFlags) -> None:
    istio_flags = parsed.given & {f.name for f in FLAGS}
    if istio_flags:
        raise ConfigError(
            "--pod takes its settings from the pod; drop --" + ", --".join(sorted(istio_flags))
        )


def _ipv6(value: str, *, dual_stack: bool) -> bool:
    if value == "":
        return hostfacts.detect_ipv6(local_addresses(), dual_stack=dual_stack)
    try:
        return parse_bool(value)
    except ValueError as e:
        raise ConfigError(f"flag --ipv6: invalid value: {e}") from None


def _dns_servers(value: str, *, given: bool) -> list[str]:
    if not given:
        return hostfacts.resolv_conf_servers()
    return [item.strip() for item in value.split(",") if item.strip()]
