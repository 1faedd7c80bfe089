"""Program ambient mode's rules: `InpodRules` in a pod's namespace, `HostProbeRules` on the node.

Both use the backends both modes share (agent.rules.backends): python-iptables, iptables-restore
legacy or nft, and `nftables`: Istio's native nftables form for ambient (agent.rules.ambient.nft,
its `inet istio-ambient-*` tables and nft sets instead of ipsets); `auto` picks as for sidecar
mode. Each table changes in one restore and only ambient's own chains and jumps are touched
(agent.rules.ambient.builder's ownership), so applying twice leaves one set and other software's
rules stay.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Collection, Iterable

from agent import constants
from agent.errors import RedirectError
from agent.netns.look import look
from agent.podinput.tokens import Address
from agent.rules import backends, compare, footprint
from agent.rules.ambient import nft_apply, routes
from agent.rules.ambient.builder import (
    HOST_OWNERSHIP,
    POD_OWNERSHIP,
    PROBE_IPSET_V4,
    PROBE_IPSET_V6,
    host_rules,
    pod_rules,
)
from agent.rules.ambient.ipset import AddressSets
from agent.rules.ambient.kubelet import kubelet_uid
from agent.rules.ambient.nft import render_pod
from agent.rules.ambient.nft_apply import HostTable
from agent.rules.ambient.nft_sets import NftAddressSets
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.backend_nft import expected_listing
from agent.rules.model import RuleSet
from agent.rules.ownership import Ownership

log = logging.getLogger(__name__)


def _program(
    netns_path: str,
    model: Callable[[], RuleSet | None],
    *,
    backend: str,
    owner: Ownership,
    native: Callable[[], None],
) -> str:
    """Replace our rules there with `model()` (None removes them); returns the backend used.
    `native` does the same in Istio's native nftables form."""
    return backends.program(
        netns_path,
        model,
        backend=backend,
        owner=owner,
        native=native,
        seen=look(netns_path),
    )


def _present(
    netns_path: str,
    model: Callable[[], RuleSet],
    *,
    backend: str,
    owner: Ownership,
    native: Callable[[], bool],
) -> bool:
    return backends.present(
        netns_path,
        model,
        backend=backend,
        owner=owner,
        native=native,
        seen=look(netns_path),
    )


class InpodRules:
    """Istio's in-pod redirection (CreateInpodRules / DeleteInpodRules), implements PodRules."""

    def __init__(self, *, backend: str = "auto") -> None:
        self.backend = backend

    def apply(self, netns_path: str, options: PodRuleOptions) -> str:
        # Routes first, as Istio does: the rules only work with them in place.
        routes.apply_routes(netns_path, ipv6=options.ipv6)
        chosen = _program(
            netns_path,
            lambda: pod_rules(options),
            backend=self.backend,
            owner=POD_OWNERSHIP,
            native=lambda: nft_apply.apply_pod(netns_path, options),
        )
        log.info(
            "applied ambient in-pod rules",
            extra={"fields": {"netns": netns_path, "backend": chosen}},
        )
        return chosen

    def remove(self, netns_path: str) -> None:
        _program(
            netns_path,
            lambda: None,
            backend=self.backend,
            owner=POD_OWNERSHIP,
            native=lambda: nft_apply.apply_pod(netns_path, None),
        )
        routes.remove_routes(netns_path)
        log.info("removed ambient in-pod rules", extra={"fields": {"netns": netns_path}})

    def present(self, netns_path: str, options: PodRuleOptions) -> bool:
        return _present(
            netns_path,
            lambda: pod_rules(options),
            backend=self.backend,
            owner=POD_OWNERSHIP,
            native=lambda: nft_apply.pod_present(netns_path, options),
        ) and routes.routes_present(netns_path, ipv6=options.ipv6)

    def compare(self, netns_path: str, options: PodRuleOptions) -> compare.RulesDiff:
        """The in-pod rules there against those for `options`, rule by rule."""
        return compare.compare(
            netns_path,
            lambda: pod_rules(options),
            backend=self.backend,
            owner=POD_OWNERSHIP,
            native=lambda: (
                nft_apply.list_pod(netns_path),
                expected_listing(render_pod(options)),
            ),
            seen=look(netns_path),
        )

    def installed(self, netns_path: str) -> bool:
        """Any chain or table of ours in the namespace (the pod was enrolled), in any backend."""
        return footprint.ours_present(netns_path)


class HostProbeRules:
    """The node-side probe SNAT (CreateHostRulesForHealthChecks) and the enrolled-IP sets.

    `netns_path` is the node's own namespace in production (the agent runs on the host
    network); tests give a namespace of their own. With the `nftables` backend the sets are nft
    sets and the SNAT matches kubelet's UID (`kubelet_uid`, else found in `proc_dir`) as Istio's
    nftables mode does.
    """

    def __init__(
        self,
        netns_path: str,
        *,
        ipv6: bool = True,
        probe_snat: str = constants.HOST_PROBE_SNAT_V4,
        probe_snat_v6: str = constants.HOST_PROBE_SNAT_V6,
        backend: str = "auto",
        kubelet_uid: str | None = None,
        proc_dir: str = "/proc",
    ) -> None:
        self.netns_path = netns_path
        self.backend = backend
        self.ipv6 = ipv6
        self.ruleset = host_rules(
            ipv6=ipv6, probe_snat=Address(probe_snat), probe_snat_v6=Address(probe_snat_v6)
        )
        self.sets: AddressSets | NftAddressSets
        if backend == "nftables":
            self.sets = NftAddressSets(netns_path, ipv6=ipv6)
        else:
            self.sets = AddressSets(
                netns_path, v4=PROBE_IPSET_V4, v6=PROBE_IPSET_V6 if ipv6 else None
            )
        self._snat = (probe_snat, probe_snat_v6)
        self._kubelet_uid = kubelet_uid
        self._proc_dir = proc_dir
        self._table: HostTable | None = None

    def _native(self) -> HostTable:
        """The nft table, built on first use: kubelet's UID is looked up only then."""
        if self._table is None:
            uid = self._kubelet_uid or kubelet_uid(self._proc_dir)
            v4, v6 = self._snat
            self._table = HostTable(
                self.netns_path, ipv6=self.ipv6, probe_snat=v4, probe_snat_v6=v6, kubelet_uid=uid
            )
        return self._table

    def ensure(self) -> None:
        self.sets.create()  # the rules name the sets: they must exist first
        chosen = _program(
            self.netns_path,
            lambda: self.ruleset,
            backend=self.backend,
            owner=HOST_OWNERSHIP,
            native=lambda: self._native().ensure(),
        )
        log.info(
            "applied host probe rules",
            extra={"fields": {"netns": self.netns_path, "backend": chosen}},
        )

    def present(self) -> bool:
        return _present(
            self.netns_path,
            lambda: self.ruleset,
            backend=self.backend,
            owner=HOST_OWNERSHIP,
            native=lambda: self._native().present(),
        )

    def add(self, uid: str, ips: Collection[str]) -> None:
        self.sets.add((ip, uid) for ip in self._usable(ips))

    def remove(self, uid: str, ips: Collection[str]) -> None:
        """Only entries still carrying this pod's UID: a reused IP belongs to its new pod."""
        current = self.sets.entries()
        self.sets.delete(ip for ip in self._usable(ips) if current.get(ip) == uid)

    def sync(self, pods: Iterable[tuple[str, Collection[str]]]) -> None:
        want = {ip: uid for uid, ips in pods for ip in self._usable(ips)}
        current = self.sets.entries()
        self.sets.delete(ip for ip in current if ip not in want)
        self.sets.add((ip, uid) for ip, uid in want.items() if current.get(ip) != uid)

    def entries(self) -> dict[str, str]:
        """ip -> pod UID, as the sets hold them now."""
        return self.sets.entries()

    def _usable(self, ips: Iterable[str]) -> list[str]:
        """Canonical spelling (as the kernel lists them); IPv6 ones only when IPv6 is on."""
        out = []
        for ip in ips:
            try:
                addr = ipaddress.ip_address(ip)
            except ValueError as e:
                raise RedirectError(f"host probe set: bad pod IP {ip!r}") from e
            if addr.version == 4 or self.ipv6:
                out.append(str(addr))
        return out

    def remove_all(self) -> None:
        _program(
            self.netns_path,
            lambda: None,
            backend=self.backend,
            owner=HOST_OWNERSHIP,
            native=self.sets.destroy,  # the nft sets and rules share one table
        )
        self.sets.destroy()  # only once no rule names them
