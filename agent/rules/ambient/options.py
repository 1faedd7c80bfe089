"""Per-pod inputs of ambient mode's in-pod rules: what agent.rules.ambient renders and applies.

The node-wide ones come from the settings (`ambient.*`), the pod's own overrides through
agent.rules.ambient.overrides; every value is a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent import constants
from agent.podinput.tokens import Address, InterfaceName

DnsProxy = Literal["enabled", "disabled"]
_PROBE_SNAT_V4 = Address(constants.HOST_PROBE_SNAT_V4)
_PROBE_SNAT_V6 = Address(constants.HOST_PROBE_SNAT_V6)


@dataclass(frozen=True)
class PodRuleOptions:
    """Per-pod inputs of Istio's in-pod rules (the flags of `rules --ambient pod`).

    The pod's own values come from agent.podinput; every value here is a token (plain text is
    checked and turned into one), so the renderers never see an unchecked string.
    """

    ipv6: bool = True
    """Node-wide ambient IPv6 (AMBIENT_IPV6); rules for IPv6 are programmed when on."""
    redirect_dns: bool = True
    """Node-wide DNS capture (AMBIENT_DNS_CAPTURE)."""
    dns_proxy: DnsProxy | None = None
    """The pod's own override (`ambient.istio.io/dns-capture` or proxy config); None = node-wide."""
    ingress: bool = False
    """The pod is an ingress gateway in ambient (Istio's IngressMode)."""
    virtual_interfaces: tuple[InterfaceName, ...] = ()
    """`istio.io/reroute-virtual-interfaces`: inbound on these is treated as outbound."""
    probe_snat: Address = _PROBE_SNAT_V4
    probe_snat_v6: Address = _PROBE_SNAT_V6

    def __post_init__(self) -> None:
        if not isinstance(self.virtual_interfaces, tuple):
            raise TypeError("virtual_interfaces: want a tuple of interface names")
        names = tuple(InterfaceName(name) for name in self.virtual_interfaces)
        object.__setattr__(self, "virtual_interfaces", names)
        for name, version in (("probe_snat", 4), ("probe_snat_v6", 6)):
            address = Address(getattr(self, name))
            if address.version != version:
                raise ValueError(f"{name}: {address!r} is not an IPv{version} address")
            object.__setattr__(self, name, address)
        if self.dns_proxy not in (None, "enabled", "disabled"):
            raise ValueError(f"dns_proxy: {self.dns_proxy!r} is not enabled or disabled")
