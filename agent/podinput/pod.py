"""Read what a pod controls from its manifest, each value through its grammar.

The one place either mode reads a pod's annotations, labels, istio-proxy env and
securityContext, and IPs. A refused value raises InvalidPodInputError (InvalidAnnotationError
for an annotation) naming the input, with a short escaped excerpt of the value: the pod is
refused before anything is programmed. Sidecar mode reads `sidecar_input`, ambient mode
`ambient_input`; both read interfaces, booleans and addresses with the same grammars.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from agent.errors import InvalidAnnotationError, InvalidPodInputError
from agent.excerpt import bounded, excerpt
from agent.podinput import grammar
from agent.podinput.grammar import WILDCARD, InterceptionMode, Wildcard
from agent.podinput.tokens import Address, Cidr, Id, InterfaceName, Port

log = logging.getLogger(__name__)
T = TypeVar("T")

PROXY_CONTAINER = "istio-proxy"

# Sidecar mode (Istio's plugin, NewRedirect).
INJECT = "sidecar.istio.io/inject"
STATUS = "sidecar.istio.io/status"
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
INCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
INCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/includeInboundPorts"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
INCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/includeOutboundPorts"
EXCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/excludeOutboundPorts"
EXCLUDE_INTERFACES = "traffic.sidecar.istio.io/excludeInterfaces"
KUBEVIRT_INTERFACES = "traffic.sidecar.istio.io/kubevirtInterfaces"
REROUTE_VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"
DNS_CAPTURE_ENV = "ISTIO_META_DNS_CAPTURE"
DUAL_STACK_ENV = "ISTIO_DUAL_STACK"
INVALID_DROP_ENV = "INVALID_DROP"
DISABLE_ENVOY_ENV = "DISABLE_ENVOY"

# Ambient mode (Istio's node agent, getPodLevelTrafficOverrides).
BYPASS_INBOUND_ANNOTATION = "ambient.istio.io/bypass-inbound-capture"
DNS_CAPTURE_ANNOTATION = "ambient.istio.io/dns-capture"

PROXY_STATUS_PORT = "15020"

PROXY_ENV = (DNS_CAPTURE_ENV, DUAL_STACK_ENV, INVALID_DROP_ENV, DISABLE_ENVOY_ENV)
"""Every env var of the istio-proxy container this module reads (the caches keep no other)."""
ANNOTATIONS = (
    INJECT,
    STATUS,
    INTERCEPTION_MODE,
    INCLUDE_OUTBOUND_IP_RANGES,
    EXCLUDE_OUTBOUND_IP_RANGES,
    INCLUDE_INBOUND_PORTS,
    EXCLUDE_INBOUND_PORTS,
    INCLUDE_OUTBOUND_PORTS,
    EXCLUDE_OUTBOUND_PORTS,
    EXCLUDE_INTERFACES,
    KUBEVIRT_INTERFACES,
    REROUTE_VIRTUAL_INTERFACES,
    BYPASS_INBOUND_ANNOTATION,
    DNS_CAPTURE_ANNOTATION,
)
"""Every annotation this module reads."""
LABELS = (INJECT,)
"""Every label this module reads."""


class Cut(str):
    """A pod's value that the agent's pod cache did not keep whole: its first characters, and
    `why`. `checked` refuses it, so a value the agent parses is never read cut; a reader that
    only compares a value with a short constant gets from the cut value the answer the whole
    value gives (neither equals it). `str()` of it is itself, so the mark survives the readers'
    conversions."""

    why: str

    def __new__(cls, text: str, why: str) -> Cut:
        made = super().__new__(cls, text)
        made.why = why
        return made

    def __str__(self) -> str:
        return self

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]  # copy and pickle
        return str.__str__(self), self.why


def refused(where: str, value: object, why: object) -> InvalidPodInputError:
    """The error for a refused value: the input, an excerpt of the value, the reason."""
    kind = InvalidAnnotationError if where.startswith("annotation ") else InvalidPodInputError
    reason = bounded(str(why), 200)
    return kind(f"{where}: invalid value {excerpt(value)}: {reason}")


def checked(where: str, value: T, parse: Callable[[T], Any]) -> Any:
    if isinstance(value, Cut):
        raise refused(where, value, value.why)
    try:
        return parse(value)
    except ValueError as e:
        raise refused(where, value, e) from None


# --- the manifest -----------------------------------------------------------------------------


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def str_map(value: object) -> dict[str, str]:
    return {str(k): "" if v is None else str(v) for k, v in mapping(value).items()}


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return str_map(mapping(pod.get("metadata")).get("annotations"))


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return str_map(mapping(pod.get("metadata")).get("labels"))


def containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key) or []
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def proxy_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The istio-proxy container: a regular container or a native sidecar (init container)."""
    spec = mapping(pod.get("spec"))
    for key in ("containers", "initContainers"):
        for container in containers(spec, key):
            if container.get("name") == PROXY_CONTAINER:
                return container
    return None


def proxy_env(container: Mapping[str, Any] | None) -> dict[str, str]:
    """The container's literal env values; `valueFrom` entries read as "" (as Istio reads them)."""
    env: dict[str, str] = {}
    for item in (container or {}).get("env") or []:
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            value = item.get("value")
            env[item["name"]] = "" if value is None else str(value)
    return env


def annotation(notes: Mapping[str, str], key: str, default: str, parse: Callable[[str], T]) -> T:
    return checked(f"annotation {key}", notes.get(key, default), parse)  # type: ignore[no-any-return]


def env_bool(env: Mapping[str, str], name: str) -> bool:
    """A boolean env var of the proxy, as Istio reads it: unset or a non-boolean word is false;
    a value that is not a word at all is refused."""
    if name not in env:
        return False
    value = checked(f"{PROXY_CONTAINER} env {name}", env[name], grammar.go_bool)
    if value is None:
        log.warning("cannot parse %s=%r on %s; taken as false", name, env[name], PROXY_CONTAINER)
    return value is True


def annotation_bool(notes: Mapping[str, str], key: str) -> bool | None:
    """strconv.ParseBool of an annotation; None when absent or a non-boolean word (Istio
    ignores those); refused when not a word."""
    if key not in notes:
        return None
    value = checked(f"annotation {key}", notes[key], grammar.go_bool)
    if value is None:
        log.warning("annotation %s=%s is not a boolean, ignored", key, excerpt(notes[key]))
    return value  # type: ignore[no-any-return]


# --- what sidecar mode reads ------------------------------------------------------------------


def inject_value(pod: Mapping[str, Any]) -> str:
    """sidecar.istio.io/inject: the label when present (even empty), else the annotation."""
    found = labels_of(pod)
    where = "label"
    if INJECT not in found:
        found, where = annotations_of(pod), "annotation"
    return checked(f"{where} {INJECT}", found.get(INJECT, ""), grammar.word)  # type: ignore[no-any-return]


def disable_envoy(proxy: Mapping[str, Any]) -> bool:
    value = proxy_env(proxy).get(DISABLE_ENVOY_ENV)
    if value is None:
        return False
    where = f"{PROXY_CONTAINER} env {DISABLE_ENVOY_ENV}"
    return checked(where, value, grammar.go_bool) is True


def dual_stack(pod: Mapping[str, Any]) -> bool:
    """ISTIO_DUAL_STACK on the istio-proxy container."""
    return env_bool(proxy_env(proxy_container(pod)), DUAL_STACK_ENV)


@dataclass(frozen=True)
class SidecarInput:
    """A sidecar pod's capture settings as the pod states them, each value checked."""

    interception_mode: InterceptionMode
    include_ranges: tuple[Cidr, ...] | Wildcard
    exclude_ranges: tuple[Cidr, ...]
    include_inbound: tuple[Port, ...] | Wildcard
    exclude_inbound: tuple[Port, ...]
    include_outbound: tuple[Port, ...]
    exclude_outbound: tuple[Port, ...]
    exclude_interfaces: tuple[InterfaceName, ...]
    reroute_interfaces: tuple[InterfaceName, ...]
    dns_capture: bool
    drop_invalid: bool
    proxy_uid: Id | None
    """The proxy container's runAsUser (None: unset)."""
    proxy_gid: Id | None


def sidecar_input(pod: Mapping[str, Any]) -> SidecarInput:
    a = annotations_of(pod)
    proxy = proxy_container(pod) or {}
    env = proxy_env(proxy)
    security = mapping(proxy.get("securityContext"))
    # Istio: the reroute annotation wins over the older kubevirt one, which is then not read.
    reroute = REROUTE_VIRTUAL_INTERFACES if REROUTE_VIRTUAL_INTERFACES in a else KUBEVIRT_INTERFACES
    context = f"{PROXY_CONTAINER} securityContext"
    g = grammar
    return SidecarInput(
        interception_mode=annotation(a, INTERCEPTION_MODE, "REDIRECT", g.interception_mode),
        include_ranges=annotation(a, INCLUDE_OUTBOUND_IP_RANGES, WILDCARD, g.cidrs_or_wildcard),
        exclude_ranges=annotation(a, EXCLUDE_OUTBOUND_IP_RANGES, "", g.cidrs),
        include_inbound=annotation(a, INCLUDE_INBOUND_PORTS, WILDCARD, g.ports_or_wildcard),
        exclude_inbound=annotation(a, EXCLUDE_INBOUND_PORTS, PROXY_STATUS_PORT, g.trimmed_ports),
        include_outbound=annotation(a, INCLUDE_OUTBOUND_PORTS, "", g.ports),
        exclude_outbound=annotation(a, EXCLUDE_OUTBOUND_PORTS, PROXY_STATUS_PORT, g.ports),
        exclude_interfaces=annotation(a, EXCLUDE_INTERFACES, "", g.interfaces),
        reroute_interfaces=annotation(a, reroute, "", g.interfaces),
        dns_capture=env_bool(env, DNS_CAPTURE_ENV),
        drop_invalid=env_bool(env, INVALID_DROP_ENV),
        proxy_uid=checked(f"{context} runAsUser", security.get("runAsUser"), g.run_as),
        proxy_gid=checked(f"{context} runAsGroup", security.get("runAsGroup"), g.run_as),
    )


# --- what ambient mode reads ------------------------------------------------------------------


@dataclass(frozen=True)
class AmbientInput:
    """An ambient pod's own traffic overrides (Istio's getPodLevelTrafficOverrides)."""

    bypass_inbound: bool
    """ambient.istio.io/bypass-inbound-capture: the pod is an ingress (no inbound capture)."""
    dns_capture: bool | None
    """ambient.istio.io/dns-capture; None: the node-wide setting."""
    virtual_interfaces: tuple[InterfaceName, ...]
    """istio.io/reroute-virtual-interfaces."""


def ambient_input(pod: Mapping[str, Any]) -> AmbientInput:
    a = annotations_of(pod)
    return AmbientInput(
        bypass_inbound=annotation_bool(a, BYPASS_INBOUND_ANNOTATION) is True,
        dns_capture=annotation_bool(a, DNS_CAPTURE_ANNOTATION),
        virtual_interfaces=annotation(a, REROUTE_VIRTUAL_INTERFACES, "", _ambient_interfaces),
    )


def _ambient_interfaces(value: str) -> tuple[InterfaceName, ...]:
    return grammar.interfaces(value, skip_empty=True)


# --- addresses --------------------------------------------------------------------------------


def pod_ips(pod: Mapping[str, Any]) -> tuple[Address, ...]:
    """status.podIPs, else status.podIP (Istio's GetPodIPsIfPresent), each an IP address."""
    status = mapping(pod.get("status"))
    entries = status.get("podIPs")
    raw = [e.get("ip") for e in entries or [] if isinstance(e, Mapping) and e.get("ip")]
    where = "status.podIPs"
    if not raw and status.get("podIP"):
        raw, where = [status["podIP"]], "status.podIP"
    return tuple(checked(where, str(ip), grammar.ip_address) for ip in raw)
