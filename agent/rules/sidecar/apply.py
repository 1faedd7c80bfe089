"""Program, check and remove a pod's redirect rules inside its network namespace.

Backends: python-iptables (in-process, legacy), iptables-legacy and iptables-nft (the
`iptables-restore` binaries run inside the namespace) and nftables (`nft -f`). `auto` picks as
Istio does: legacy when the node (host or pod namespace) already holds legacy rules, else nft.

Speed (every pod start waits for this): the host's answer is read once per process, the pod's
from a probe of its namespace (agent.rules.probe), and the `-save` programs run only where the
probe saw tables. Callers that probe anyway pass `probe=` so one look serves every step.
"""

from __future__ import annotations

import functools
import logging
import shutil
from typing import Final

from agent.errors import RedirectError
from agent.netns import run_command
from agent.rules import backend_iptc, backend_nft, backend_restore
from agent.rules.model import Family
from agent.rules.ownership import OUR_TABLES
from agent.rules.probe import NetnsProbe
from agent.rules.probe import probe as probe_netns
from agent.rules.sidecar import hostfacts, routes
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.capture import CaptureConfig

log = logging.getLogger(__name__)

BACKENDS: Final = ("python-iptables", "iptables-legacy", "iptables-nft", "nftables")
HOST_NETNS = "/proc/self/ns/net"


def apply_rules(
    netns_path: str,
    config: CaptureConfig,
    *,
    backend: str = "auto",
    probe: NetnsProbe | None = None,
) -> str:
    """Program `config` into the namespace; returns the backend used.

    Atomic per table, idempotent (our old rules are replaced), other rules are kept. `probe`:
    a probe of that namespace taken just before (saves taking another).
    """
    seen = probe or probe_netns(netns_path)
    chosen = choose_backend(netns_path, backend, probe=seen)
    ruleset = build(config)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, ruleset)
    elif chosen == "nftables":
        backend_nft.apply_native(netns_path, config)  # Istio's native nftables rules
    else:
        variant = _variant(chosen)
        backend_restore.apply(netns_path, ruleset, variant, empty=_empty(seen, variant))
    routes.apply_routes(netns_path, config)
    log.info("applied redirect rules", extra={"fields": {"netns": netns_path, "backend": chosen}})
    return chosen


def remove_rules(netns_path: str, *, backend: str = "auto") -> None:
    """Take out only our chains, our jumps and our TPROXY routing."""
    chosen = choose_backend(netns_path, backend)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, None)
    elif chosen == "nftables":
        backend_nft.remove_all(netns_path)
    else:
        backend_restore.apply(netns_path, None, _variant(chosen))
    routes.remove_routes(netns_path)


def rules_present(
    netns_path: str,
    config: CaptureConfig,
    *,
    backend: str = "auto",
    probe: NetnsProbe | None = None,
) -> bool:
    """Are exactly our rules for `config` in place (CNI CHECK)?"""
    seen = probe or probe_netns(netns_path)
    chosen = choose_backend(netns_path, backend, probe=seen)
    ruleset = build(config)
    if chosen == "python-iptables":
        return backend_iptc.present(netns_path, ruleset)
    if chosen == "nftables":
        return backend_nft.present_native(netns_path, config)
    variant = _variant(chosen)
    return backend_restore.present(netns_path, ruleset, variant, empty=_empty(seen, variant))


def host_facts(
    netns_path: str, *, resolv_conf: str = "/etc/resolv.conf", probe: NetnsProbe | None = None
) -> tuple[bool, list[str]]:
    """(IPv6 on?, DNS servers) for the pod: IPv6 when the pod has a global IPv6 address,
    resolvers from the node's resolv.conf."""
    # Istio's dual-stack rule needs only the IPv6 addresses: any usable one turns IPv6 on.
    addresses = (probe or probe_netns(netns_path)).ipv6_addresses
    return hostfacts.ipv6_enabled(addresses, dual_stack=True), hostfacts.resolv_conf_servers(
        resolv_conf
    )


def probe(netns_path: str) -> NetnsProbe:
    """One look into the namespace, for passing to host_facts, apply_rules and rules_present."""
    return probe_netns(netns_path)


def choose_backend(netns_path: str, backend: str, *, probe: NetnsProbe | None = None) -> str:
    if backend in BACKENDS:
        return backend
    if backend != "auto":
        known = ", ".join(BACKENDS)
        raise RedirectError(f"unknown rule backend {backend!r} (want auto or {known})")
    if _host_uses_legacy() or _pod_uses_legacy(netns_path, probe):
        return "iptables-legacy"
    return "iptables-nft"


@functools.cache
def _host_uses_legacy() -> bool:
    """The node's own namespace, once per process: the agent runs for the node's lifetime
    and what the node uses is settled before pods start (Istio's agent also looks once)."""
    return _legacy_in_use(HOST_NETNS)


def _pod_uses_legacy(netns_path: str, probe: NetnsProbe | None) -> bool:
    loaded = (probe or probe_netns(netns_path)).legacy_loaded
    # No legacy table was ever used there (a fresh sandbox): nothing to read.
    return loaded is not False and _legacy_in_use(netns_path)


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


def _empty(seen: NetnsProbe, variant: str) -> frozenset[Family]:
    """Families in which the probe saw none of our tables: there is nothing of ours to read."""
    families: tuple[Family, ...] = (4, 6)
    return frozenset(f for f in families if seen.tables_absent(variant, f, OUR_TABLES))
