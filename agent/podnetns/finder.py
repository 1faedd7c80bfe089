"""Find running pods' network namespaces by identity: what the runtime told the agent at ADD,
else the namespace of the pod's own processes (by cgroup), holding one of the pod's IPs.

    recorded(uid)    the netns of the pod's last ADD, still the same namespace   -> found
    scan_node()      namespaces of processes whose cgroup names the pod's UID:
        exactly one holds one of the pod's IPs                                     -> found
        none holds one                                                             -> refused
        several hold one                                                           -> refused
    any other namespace holding one of a pod's IPs is reported: it cannot move the pod's
    namespace (the pod is found by identity), and is never used as the pod's either.

Refusals and foreign holders are logged and counted (istio_cni_pod_netns_conflicts_total), each
once per pod and namespace, so a repair loop that looks every few seconds does not flood.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from prometheus_client import Counter

from agent.errors import AgentError
from agent.netns.look import NetnsId
from agent.podnetns.scan import NetnsSeen, scan_node

log = logging.getLogger(__name__)

CONFLICTS = Counter(
    "istio_cni_pod_netns_conflicts",
    "Pods whose network namespace could not be told by identity alone, by kind: "
    "address (another namespace holds one of the pod's IPs), ambiguous (several namespaces of "
    "the pod's processes hold its IPs), unowned (its processes' namespace holds none of them).",
    ["kind"],
)

AddressReader = Callable[[str], Collection[str]]
Recorded = Callable[[str], str | None]
"""Pod UID -> the netns path its last CNI ADD named, while it is still that namespace."""


class PodNetnsFinder:
    """`finder(pods) -> {uid: netns path}` for the pods found; the rest are not on this node
    (yet), or refused (logged)."""

    def __init__(
        self,
        *,
        proc_dir: str,
        netns_dir: str,
        read_addresses: AddressReader,
        recorded: Recorded | None = None,
    ) -> None:
        self._proc_dir = proc_dir
        self._netns_dir = netns_dir
        self._read_addresses = read_addresses
        self._recorded = recorded
        self._lock = threading.Lock()
        self._reported: set[tuple[str, str, NetnsId | None]] = set()

    def __call__(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        found: dict[str, str] = {}
        unknown: list[Mapping[str, Any]] = []
        for pod in pods:
            uid = _uid(pod)
            path = self._recorded(uid) if self._recorded is not None and uid else None
            if path is not None:
                found[uid] = path
            elif uid:
                unknown.append(pod)
        if unknown:
            found.update(self._scan(unknown))
        return found

    def _scan(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
        seen = scan_node(proc_dir=self._proc_dir, netns_dir=self._netns_dir)
        with self._lock:  # reports about namespaces that are gone can be made again
            live = {ns.ident for ns in seen}
            self._reported = {k for k in self._reported if k[2] is None or k[2] in live}
        addresses = {ns.ident: self._addresses(ns.path) for ns in seen}
        holders: dict[str, list[NetnsSeen]] = {}
        for ns in seen:
            for address in addresses[ns.ident]:
                holders.setdefault(address, []).append(ns)
        found: dict[str, str] = {}
        for pod in pods:
            mine = self._match(pod, seen, addresses)
            if mine is None:
                continue
            found[_uid(pod)] = mine.path
            for ip in _ips(pod):
                for other in holders.get(ip, []):
                    if other.ident != mine.ident:
                        self._report(pod, "address", other.ident, ip=ip, holder=other.path)
        return found

    def _match(
        self,
        pod: Mapping[str, Any],
        seen: Sequence[NetnsSeen],
        addresses: Mapping[NetnsId, frozenset[str]],
    ) -> NetnsSeen | None:
        uid, ips = _uid(pod).lower(), set(_ips(pod))
        claimed = [ns for ns in seen if uid in ns.pods]
        if not claimed or not ips:
            return None  # not started here (yet), or nothing to check a namespace against
        owning = [ns for ns in claimed if addresses[ns.ident] & ips]
        if len(owning) == 1:
            return owning[0]
        if owning:
            paths = ", ".join(ns.path for ns in owning)
            self._report(pod, "ambiguous", None, paths=paths)
        else:
            self._report(pod, "unowned", claimed[0].ident, paths=claimed[0].path)
        return None

    def _addresses(self, path: str) -> frozenset[str]:
        try:
            return frozenset(_canonical(a) for a in self._read_addresses(path))
        except (OSError, AgentError) as e:
            log.debug("cannot read addresses of netns %s: %s", path, e)
            return frozenset()

    def _report(
        self, pod: Mapping[str, Any], kind: str, other: NetnsId | None, **fields: str
    ) -> None:
        key = (_uid(pod), kind, other)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        CONFLICTS.labels(kind=kind).inc()
        log.error(
            _MESSAGES[kind],
            extra={"fields": {"pod": _ref(pod), "uid": _uid(pod), "kind": kind, **fields}},
        )


_MESSAGES = {
    "address": "another network namespace holds the pod's IP; the pod keeps its own namespace "
    "(found by its UID), the other is not treated as the pod's",
    "ambiguous": "several network namespaces of the pod's processes hold its IP; none is used",
    "unowned": "the network namespace of the pod's processes holds none of its IPs; not used",
}


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _ips(pod: Mapping[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    ips = [str(e.get("ip")) for e in status.get("podIPs") or [] if e.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return [_canonical(ip) for ip in ips]


def _canonical(address: str) -> str:
    """One spelling per address (IPv6 compressed, v4-mapped as v4), so equal ones compare equal."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)
