"""Program, check and remove a sidecar pod's redirect rules inside its network namespace.

The backend (python-iptables, iptables-legacy, iptables-nft, nftables, or `auto`) is chosen and
called by agent.rules.backends; this module gives it sidecar mode's model (agent.rules.sidecar
.builder), its native nftables rules (agent.rules.sidecar.nft_apply) and the TPROXY routes.
Callers that look into the namespace anyway pass `seen=` so one look serves every step.
"""

from __future__ import annotations

import logging

from agent.netns import look as netns_look
from agent.netns.look import NetnsLook
from agent.rules import backends, compare
from agent.rules.backend_nft import expected_listing
from agent.rules.model import RuleSet
from agent.rules.ownership import SIDECAR
from agent.rules.sidecar import hostfacts, nft_apply, routes
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import render_native

log = logging.getLogger(__name__)


def apply_rules(
    netns_path: str,
    config: CaptureConfig,
    *,
    backend: str = "auto",
    seen: NetnsLook | None = None,
) -> str:
    """Program `config` into the namespace; returns the backend used.

    Atomic per table, idempotent (our old rules are replaced), other rules are kept. `seen`:
    a look into that namespace taken just before (saves taking another).
    """
    chosen = backends.program(
        netns_path,
        lambda: build(config),
        backend=backend,
        owner=SIDECAR,
        native=lambda: nft_apply.apply_native(netns_path, config),  # Istio's native rules
        seen=seen or netns_look.look(netns_path),
    )
    routes.apply_routes(netns_path, config)
    # Debug: the caller logs each pod's result (the pod server, repair), and readiness applies
    # rules in its scratch namespace every half minute.
    log.debug("applied redirect rules", extra={"fields": {"netns": netns_path, "backend": chosen}})
    return chosen


def remove_rules(netns_path: str, *, backend: str = "auto") -> None:
    """Take out only our chains, our jumps and our TPROXY routing."""
    backends.program(
        netns_path,
        lambda: None,
        backend=backend,
        owner=SIDECAR,
        native=lambda: nft_apply.remove_all(netns_path),
        seen=None,
    )
    routes.remove_routes(netns_path)


def rules_present(
    netns_path: str,
    config: CaptureConfig,
    *,
    backend: str = "auto",
    seen: NetnsLook | None = None,
) -> bool:
    """Are exactly our rules for `config` in place (CNI CHECK)?"""
    return backends.present(
        netns_path,
        lambda: build(config),
        backend=backend,
        owner=SIDECAR,
        native=lambda: nft_apply.present_native(netns_path, config),
        seen=seen or netns_look.look(netns_path),
    )


def rules_diff(
    netns_path: str,
    config: CaptureConfig | None,
    *,
    backend: str = "auto",
    seen: NetnsLook | None = None,
) -> compare.RulesDiff:
    """Our rules in the namespace against those for `config` (None: a pod that gets none)."""

    def native() -> tuple[str, str]:
        want = expected_listing(render_native(config)) if config is not None else ""
        return nft_apply.list_native(netns_path), want

    return compare.compare(
        netns_path,
        lambda: build(config) if config is not None else RuleSet(()),
        backend=backend,
        owner=SIDECAR,
        native=native,
        seen=seen or netns_look.look(netns_path),
    )


def host_facts(
    netns_path: str, *, resolv_conf: str = "/etc/resolv.conf", seen: NetnsLook | None = None
) -> tuple[bool, list[str]]:
    """(IPv6 on?, DNS servers) for the pod: IPv6 when the pod has a global IPv6 address,
    resolvers from the node's resolv.conf."""
    # Istio's dual-stack rule needs only the IPv6 addresses: any usable one turns IPv6 on.
    addresses = (seen or netns_look.look(netns_path)).ipv6_addresses
    return hostfacts.ipv6_enabled(addresses, dual_stack=True), hostfacts.resolv_conf_servers(
        resolv_conf
    )


def look(netns_path: str) -> NetnsLook:
    """One look into the namespace, for passing to host_facts, apply_rules and rules_present."""
    return netns_look.look(netns_path)
