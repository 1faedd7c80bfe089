"""Program, check and remove a pod's redirect rules inside its network namespace.

Backends: python-iptables (in-process, legacy), iptables-legacy and iptables-nft (the
`iptables-restore` binaries run inside the namespace) and nftables (`nft -f`). `auto` picks as
Istio does: legacy when the node (host or pod namespace) already holds legacy rules, else nft.
"""

from __future__ import annotations

import logging
import shutil
from typing import Final

from agent.errors import RedirectError
from agent.netns import run_command, run_in_netns
from agent.rules import backend_iptc, backend_nft, backend_restore, hostfacts, routes
from agent.rules.builder import build
from agent.rules.config import CaptureConfig

log = logging.getLogger(__name__)

BACKENDS: Final = ("python-iptables", "iptables-legacy", "iptables-nft", "nftables")
HOST_NETNS = "/proc/self/ns/net"


def apply_rules(netns_path: str, config: CaptureConfig, *, backend: str = "auto") -> str:
    """Program `config` into the namespace; returns the backend used.

    Atomic per table, idempotent (our old rules are replaced), other rules are kept.
    """
    chosen = choose_backend(netns_path, backend)
    ruleset = build(config)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, ruleset)
    elif chosen == "nftables":
        backend_nft.apply(netns_path, ruleset)
    else:
        backend_restore.apply(netns_path, ruleset, _variant(chosen))
    routes.apply_routes(netns_path, config)
    log.info("applied redirect rules", extra={"fields": {"netns": netns_path, "backend": chosen}})
    return chosen


def remove_rules(netns_path: str, *, backend: str = "auto") -> None:
    """Take out only our chains, our jumps and our TPROXY routing."""
    chosen = choose_backend(netns_path, backend)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, None)
    elif chosen == "nftables":
        backend_nft.apply(netns_path, None)
    else:
        backend_restore.apply(netns_path, None, _variant(chosen))
    routes.remove_routes(netns_path)


def rules_present(netns_path: str, config: CaptureConfig, *, backend: str = "auto") -> bool:
    """Are exactly our rules for `config` in place (CNI CHECK)?"""
    chosen = choose_backend(netns_path, backend)
    ruleset = build(config)
    if chosen == "python-iptables":
        return backend_iptc.present(netns_path, ruleset)
    if chosen == "nftables":
        return backend_nft.present(netns_path, ruleset)
    return backend_restore.present(netns_path, ruleset, _variant(chosen))


def host_facts(netns_path: str, *, resolv_conf: str = "/etc/resolv.conf") -> tuple[bool, list[str]]:
    """(IPv6 on?, DNS servers) for the pod: IPv6 when the pod has a global IPv6 address,
    resolvers from the node's resolv.conf."""
    addresses = run_in_netns(netns_path, hostfacts.local_addresses)
    return hostfacts.ipv6_enabled(addresses, dual_stack=True), hostfacts.resolv_conf_servers(
        resolv_conf
    )


def choose_backend(netns_path: str, backend: str) -> str:
    if backend in BACKENDS:
        return backend
    if backend != "auto":
        known = ", ".join(BACKENDS)
        raise RedirectError(f"unknown rule backend {backend!r} (want auto or {known})")
    if _legacy_in_use(HOST_NETNS) or _legacy_in_use(netns_path):
        return "iptables-legacy"
    return "iptables-nft"


def _legacy_in_use(netns_path: str) -> bool:
    """Any rule or non-default policy in the legacy tables of that namespace."""
    if shutil.which("iptables-legacy-save") is None:
        return False
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        done = run_command(netns_path, [tool])
        if done.returncode != 0:
            continue
        for line in done.stdout.splitlines():
            if line.startswith("-A ") or (line.startswith(":") and " DROP " in line):
                return True
    return False


def _variant(backend: str) -> str:
    return "legacy" if backend == "iptables-legacy" else "nft"
