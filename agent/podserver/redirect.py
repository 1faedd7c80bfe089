"""The redirect operations the pod server runs for a pod, composed from agent.rules."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agent import metrics
from agent.errors import RedirectError
from agent.netns import run_in_netns
from agent.rules import backends
from agent.rules.probe import NetnsProbe, probe_here
from agent.rules.sidecar import apply as rules_apply
from agent.rules.sidecar import pod as rules_pod
from agent.rules.sidecar.capture import CaptureConfig

RTM_NEWADDR, RTM_GETADDR = 20, 22
NLM_F_REQUEST_DUMP = 0x301
NLMSG_ERROR, NLMSG_DONE = 2, 3
IFA_ADDRESS, IFA_LOCAL = 1, 2


@dataclass(frozen=True)
class NetnsLook:
    """One look into the pod's netns: the rule probe and the pod's IPv4 addresses."""

    probe: NetnsProbe
    ipv4_addresses: tuple[str, ...]

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address of the netns, IPv4 first (the order Istio sees them in)."""
        return self.ipv4_addresses + self.probe.ipv6_addresses


class RulesRedirector:
    """decide / apply / present for one pod, with the node's settings."""

    def __init__(self, *, exclude_namespaces: Collection[str], backend: str) -> None:
        self._exclude = tuple(exclude_namespaces)
        self._backend = backend

    def decide(self, pod: Mapping[str, Any]) -> rules_pod.Decision:
        return rules_pod.decide(pod, exclude_namespaces=self._exclude)

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        look = self._look(netns)
        config = self._config(pod, look)
        try:
            return rules_apply.apply_rules(netns, config, backend=self._backend, probe=look.probe)
        except Exception as e:
            metrics.RULES_APPLY_FAILURES.labels(backend=self._chosen(netns, look)).inc()
            if isinstance(e, RedirectError):
                raise
            raise RedirectError(f"apply rules in {netns} (backend {self._backend}): {e}") from e

    def _chosen(self, netns: str, look: NetnsLook) -> str:
        """The backend an apply used (the metric's label): a bounded name, `auto` if unknown."""
        try:
            return backends.choose_backend(netns, self._backend, probe=look.probe)
        except Exception:  # an unknown configured backend, a namespace gone meanwhile
            return "auto"

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        look = self._look(netns)
        config = self._config(pod, look)
        return rules_apply.rules_present(netns, config, backend=self._backend, probe=look.probe)

    @staticmethod
    def _look(netns: str) -> NetnsLook:
        """One look into the netns serves the IPv6 decision and the apply (each pod start
        waits)."""
        try:
            return run_in_netns(netns, look_here)
        except RedirectError:
            raise
        except Exception as e:
            raise RedirectError(f"look into netns {netns}: {e}") from e

    @staticmethod
    def _config(pod: Mapping[str, Any], look: NetnsLook) -> CaptureConfig:
        # Istio's plugin: IPv6 rules from the pod's addresses and its ISTIO_DUAL_STACK; with DNS
        # capture it takes all port-53 traffic, so the resolvers are not read.
        ipv6 = rules_pod.ipv6_for_pod(pod, look.addresses)
        # InvalidPodInputError names the input and an excerpt of its value: let it through.
        rules_pod.pod_ips(pod)  # not read here, but a pod whose IPs are not IPs is refused
        return rules_pod.capture_config_for_pod(pod, ipv6=ipv6)


def look_here() -> NetnsLook:
    """The look of the calling thread's namespace."""
    return NetnsLook(probe_here(), tuple(ipv4_addresses_here()))


def ipv4_addresses_here() -> list[str]:
    """The IPv4 addresses of the calling thread's namespace (an RTM_GETADDR dump, AF_INET)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(2.0)
        # nlmsghdr(len, type, flags, seq, pid) + ifaddrmsg(family, prefixlen, flags, scope, index)
        sock.send(
            struct.pack("=IHHII", 24, RTM_GETADDR, NLM_F_REQUEST_DUMP, 1, 0)
            + struct.pack("=BBBBI", socket.AF_INET, 0, 0, 0, 0)
        )
        return _read_addresses(sock)


def _read_addresses(sock: socket.socket) -> list[str]:
    addresses: list[str] = []
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, offset)
            if length < 16:
                raise OSError("netlink: malformed address message")
            if kind == NLMSG_DONE:
                return addresses
            if kind == NLMSG_ERROR:
                raise OSError("netlink: error reply to the address dump")
            if kind == RTM_NEWADDR and data[offset + 16] == socket.AF_INET:
                address = _ipv4_attribute(data[offset + 24 : offset + length])
                if address is not None:
                    addresses.append(address)
            offset += (length + 3) & ~3


def _ipv4_attribute(attrs: bytes) -> str | None:
    """IFA_LOCAL (the interface's own address), else IFA_ADDRESS, as Go's net package reads."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, offset)
        if length < 4:
            break
        if kind in (IFA_ADDRESS, IFA_LOCAL) and length == 8:
            found[kind] = attrs[offset + 4 : offset + 8]
        offset += (length + 3) & ~3
    raw = found.get(IFA_LOCAL, found.get(IFA_ADDRESS))
    return None if raw is None else str(ipaddress.IPv4Address(raw))
