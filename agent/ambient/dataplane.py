"""The three parts of ambient mode and the contract between them.

- `PodRules` (agent.rules.ambient.apply): Istio's in-pod redirection, programmed inside a pod's
  netns.
- `HostProbeRules` (agent.rules.ambient.apply): the node-side SNAT that lets kubelet's probes
  reach enrolled pods, keyed by the set of enrolled pod IPs.
- `ZtunnelLink` (agent.ambient.zds): the ZDS server on ztunnel's socket, which hands each enrolled
  pod's netns to ztunnel.

`agent.ambient.mesh` drives them in Istio's order (net_linux.go, meshdataplane_linux.go): add =
in-pod rules, ztunnel, host probe IPs; remove = host probe IPs, in-pod rules, ztunnel.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from agent.rules.ambient.options import PodRuleOptions


@dataclass(frozen=True)
class AmbientPod:
    """An enrolled (or to-be-enrolled) pod as the three parts need it."""

    uid: str
    name: str
    namespace: str
    service_account: str
    ips: tuple[str, ...]
    """The pod's IPs, IPv4 and/or IPv6: at a CNI ADD those of the CNI chain's result
    (prevResult, as Istio), else status.podIPs."""
    netns_path: str
    """Path of the pod's network namespace as the agent sees it (e.g. /var/run/netns/cni-...);
    empty for a pod enrolled before a restart whose namespace was not found (ztunnel gets
    KeepWorkload for it, as from Istio)."""
    sandbox: str = ""
    """The CNI ADD's container id (sandbox) that enrolled the pod; empty when the pod was
    enrolled running (watch, start-up). Only that sandbox's DEL releases the pod."""


class PodRules(Protocol):
    def apply(self, netns_path: str, options: PodRuleOptions) -> str:
        """Program the in-pod rules and routes (idempotent: an existing set is replaced, never
        duplicated); returns the backend used. Raises agent.errors.RedirectError."""
        ...

    def remove(self, netns_path: str) -> None:
        """Remove everything `apply` programmed; a namespace without them is not an error."""
        ...

    def present(self, netns_path: str, options: PodRuleOptions) -> bool:
        """Are exactly the expected rules in place? (reconcile on start-up)"""
        ...

    def installed(self, netns_path: str) -> bool:
        """Is any rule of ours in the namespace? (after a restart: was the pod enrolled?)"""
        ...


class HostProbeRules(Protocol):
    def ensure(self) -> None:
        """Program the node-side chains/rules and the empty-or-current address sets."""
        ...

    def add(self, uid: str, ips: Collection[str]) -> None:
        """Add the pod's IPs to the enrolled set (idempotent)."""
        ...

    def remove(self, uid: str, ips: Collection[str]) -> None:
        """Drop the pod's IPs from the enrolled set (missing entries are fine)."""
        ...

    def sync(self, pods: Iterable[tuple[str, Collection[str]]]) -> None:
        """Make the set hold exactly these (uid, ips): start-up reconcile."""
        ...

    def remove_all(self) -> None:
        """Uninstall: remove rules and sets."""
        ...


class ZtunnelLink(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    def ready(self) -> bool:
        """The socket is listening (readiness reflects the ZDS server)."""
        ...

    @property
    def connected(self) -> bool:
        """A ztunnel is connected and has acknowledged the snapshot."""
        ...

    def add(self, pod: AmbientPod) -> None:
        """Send AddWorkload with the pod's netns fd and wait for ztunnel's ack.

        Not connected: the pod is kept for the next snapshot and `ZtunnelNotConnected` is raised
        (Istio's partial add: rules stay, the pod is sent when ztunnel connects). An Ack with an
        error or no ack in time raises `ZtunnelError`."""
        ...

    def remove(self, uid: str) -> None:
        """Send DelWorkload (or just forget the pod when ztunnel is away)."""
        ...

    def set_snapshot_source(self, source: SnapshotSource) -> None:
        """Where the pods sent on each (re)connect come from."""
        ...


class SnapshotSource(Protocol):
    def __call__(self) -> Iterable[AmbientPod]: ...
