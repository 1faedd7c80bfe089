"""Which pods get redirect rules, and with which settings: the decisions of Istio's CNI plugin.

`decide` answers "would Istio's plugin program this pod at all?" from the pod manifest;
`capture_config_for_pod` turns the pod's `sidecar.istio.io/*` and `traffic.sidecar.istio.io/*`
annotations and its istio-proxy container into a CaptureConfig; `ipv6_for_pod` says whether the
pod gets IPv6 rules. Each follows Istio's plugin (cni/pkg/plugin: plugin.go, kubernetes.go,
sidecar_redirect.go) input by input, including what it ignores. Bad annotation values raise
InvalidAnnotationError naming the annotation and the value: the pod fails to start rather than
run without the capture its owner asked for.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from agent import constants
from agent.errors import InvalidAnnotationError
from agent.rules import config as cfg
from agent.rules import hostfacts
from agent.rules.config import WILDCARD, CaptureConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

PROXY_CONTAINER = "istio-proxy"
INIT_CONTAINER = "istio-init"
DEFAULT_PROXY_ID = constants.PROXY_ID

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

PROXY_STATUS_PORT = constants.PROXY_STATUS_PORT
ALWAYS_EXCLUDED_INBOUND = constants.ALWAYS_EXCLUDED_INBOUND

INTERFACE_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_.\-]*")
"""Istio's interface-name check (pkg/util/net ValidateInterfaceNames), at most 15 characters."""


@dataclass(frozen=True)
class Decision:
    redirect: bool
    reason: str


def decide(pod: Mapping[str, Any], *, exclude_namespaces: Collection[str]) -> Decision:
    """Would Istio's CNI plugin (sidecar mode) program this pod's network namespace?"""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    namespace = str(meta.get("namespace") or "default")
    if namespace in exclude_namespaces:
        return Decision(False, f"namespace {namespace} is excluded")
    # Not an input of Istio's plugin: the runtime never calls CNI for a host-network pod. Said
    # here so that `rules --pod` explains such a pod instead of printing rules nobody applies.
    if spec.get("hostNetwork") is True:
        return Decision(False, "pod uses the host network")
    names = [str(c.get("name")) for c in _containers(spec, "containers")]
    names += [str(c.get("name")) for c in _containers(spec, "initContainers")]
    if INIT_CONTAINER in names:
        return Decision(False, f"pod has the {INIT_CONTAINER} container, which sets up rules")
    proxy = proxy_container(pod)
    if proxy is None:
        return Decision(False, f"pod has no {PROXY_CONTAINER} container")
    if parse_bool(proxy_env(proxy).get(DISABLE_ENVOY_ENV)) is True:
        return Decision(False, f"{DISABLE_ENVOY_ENV} is set on {PROXY_CONTAINER}")
    kind = proxy_type(proxy)
    if kind not in ("", "sidecar"):
        return Decision(False, f"proxy type is {kind}, not sidecar")
    inject = inject_value(meta)
    if parse_bool(inject) is False:
        return Decision(False, f"injection disabled ({INJECT}={inject})")
    if STATUS not in _str_map(meta.get("annotations")):
        return Decision(False, f"no {STATUS} annotation: the sidecar was not injected")
    return Decision(True, "pod has an injected sidecar")


def proxy_type(proxy: Mapping[str, Any]) -> str:
    """The `<type>` of the proxy's `proxy <type>` args; "" when the args are not of that form."""
    args = proxy.get("args")
    if isinstance(args, list) and len(args) >= 2 and args[0] == "proxy":
        return str(args[1])
    return ""


def inject_value(meta: Mapping[str, Any]) -> str:
    """sidecar.istio.io/inject: the label when present (even empty), else the annotation."""
    labels = _str_map(meta.get("labels"))
    if INJECT in labels:
        return labels[INJECT]
    return _str_map(meta.get("annotations")).get(INJECT, "")


def capture_config_for_pod(
    pod: Mapping[str, Any], *, ipv6: bool, dns_servers: Sequence[str] = ()
) -> CaptureConfig:
    """The capture settings Istio's plugin derives for this pod.

    `ipv6`: the answer of `ipv6_for_pod`. `dns_servers` is accepted and unused: with DNS capture
    Istio's plugin captures all port-53 traffic and never reads the resolvers.
    """
    del dns_servers
    meta = _mapping(pod.get("metadata"))
    a = _str_map(meta.get("annotations"))
    proxy = proxy_container(pod) or {}
    env = proxy_env(proxy)
    security = _mapping(proxy.get("securityContext"))
    exclude_in = _annotation(a, EXCLUDE_INBOUND_PORTS, PROXY_STATUS_PORT, _trimmed_port_list)
    reroute_key = (
        REROUTE_VIRTUAL_INTERFACES if REROUTE_VIRTUAL_INTERFACES in a else KUBEVIRT_INTERFACES
    )
    dns = _env_bool(env, DNS_CAPTURE_ENV)
    return CaptureConfig(
        proxy_uids=(_proxy_id(security.get("runAsUser")),),
        proxy_gids=(_proxy_id(security.get("runAsGroup")),),
        interception_mode=_annotation(a, INTERCEPTION_MODE, "REDIRECT", _mode),
        outbound_ip_ranges_include=_annotation(
            a, INCLUDE_OUTBOUND_IP_RANGES, WILDCARD, _cidr_list_or_wildcard
        ),
        outbound_ip_ranges_exclude=_annotation(a, EXCLUDE_OUTBOUND_IP_RANGES, "", _cidr_list),
        inbound_ports_exclude=exclude_in,
        inbound_ports_include=_annotation(
            a, INCLUDE_INBOUND_PORTS, WILDCARD, _port_list_or_wildcard
        ),
        outbound_ports_exclude=_annotation(
            a, EXCLUDE_OUTBOUND_PORTS, PROXY_STATUS_PORT, _port_list
        ),
        outbound_ports_include=_annotation(a, INCLUDE_OUTBOUND_PORTS, "", _port_list),
        exclude_interfaces=_annotation(a, EXCLUDE_INTERFACES, "", _interfaces),
        reroute_virtual_interfaces=_annotation(a, reroute_key, "", _interfaces),
        redirect_dns=dns,
        capture_all_dns=dns,
        drop_invalid=_env_bool(env, INVALID_DROP_ENV),
        enable_ipv6=ipv6,
    )


# --- IPv6 -------------------------------------------------------------------------------------


def dual_stack(pod: Mapping[str, Any]) -> bool:
    """ISTIO_DUAL_STACK on the istio-proxy container (unparsable: off, with a warning)."""
    proxy = proxy_container(pod)
    return _env_bool(proxy_env(proxy) if proxy is not None else {}, DUAL_STACK_ENV)


def ipv6_for_pod(pod: Mapping[str, Any], addresses: Iterable[str]) -> bool:
    """Does Istio's plugin write IPv6 rules for this pod, whose netns holds `addresses`?

    Istio looks at the netns's addresses as Go lists them, every IPv4 address before any IPv6
    one, skipping loopback and link-local ones. With ISTIO_DUAL_STACK any IPv6 address turns
    IPv6 on; without it the first address decides, so a pod with an IPv4 address gets no IPv6
    rules even when it also has IPv6 addresses. The order `addresses` come in does not matter.
    (A netns without a usable address is an error in Istio; here it means IPv6 off.)
    """
    ordered = sorted(addresses, key=_is_ipv6)  # stable: IPv4 first, as Go's listing
    return hostfacts.ipv6_enabled(ordered, dual_stack=dual_stack(pod))


def pod_ips(pod: Mapping[str, Any]) -> list[str]:
    """status.podIPs (else status.podIP) of a pod manifest: the pod's addresses when it runs."""
    status = _mapping(pod.get("status"))
    entries = status.get("podIPs")
    ips = [str(e.get("ip")) for e in entries or [] if isinstance(e, Mapping) and e.get("ip")]
    if not ips and status.get("podIP"):
        ips = [str(status["podIP"])]
    return ips


def _is_ipv6(address: str) -> bool:
    return ":" in address


# --- the proxy container ----------------------------------------------------------------------


def proxy_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The istio-proxy container: a regular container or a native sidecar (init container)."""
    spec = _mapping(pod.get("spec"))
    for key in ("containers", "initContainers"):
        for container in _containers(spec, key):
            if container.get("name") == PROXY_CONTAINER:
                return container
    return None


def proxy_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's literal env values; `valueFrom` entries read as "" (as Istio reads them)."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            value = item.get("value")
            env[item["name"]] = "" if value is None else str(value)
    return env


def load_pod_manifest(path: str) -> dict[str, Any]:
    """A Pod manifest from a YAML or JSON file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not valid YAML or JSON: {e}") from e
    if not isinstance(data, dict) or data.get("kind", "Pod") != "Pod":
        raise ValueError(f"{path}: not a Pod manifest")
    return data


def parse_bool(text: str | None) -> bool | None:
    """Go's strconv.ParseBool; None where it fails."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


# --- annotation values, checked as Istio's plugin checks them ---------------------------------


def _annotation(
    annotations: Mapping[str, str], key: str, default: str, parse: Callable[[str], T]
) -> T:
    value = annotations.get(key, default)
    try:
        return parse(value)
    except ValueError as e:
        raise InvalidAnnotationError(f"annotation {key}: invalid value {value!r}: {e}") from None


def _mode(value: str) -> cfg.InterceptionMode:
    if value == "TPROXY":
        return "TPROXY"
    if value != "REDIRECT":
        raise ValueError("interception mode must be REDIRECT or TPROXY")
    return "REDIRECT"


def _trimmed_port_list(value: str) -> tuple[str, ...]:
    """excludeInboundPorts: Istio trims the whole value, appends its own ports, then drops
    repeats of an item as written (`9000,9000`: one rule; `9000, 9000`: two)."""
    text = value.strip()
    ports = [*_port_list(text), *ALWAYS_EXCLUDED_INBOUND]
    written = [*(text.split(",") if text else []), *ALWAYS_EXCLUDED_INBOUND]
    return tuple(port for i, port in enumerate(ports) if written[i] not in written[:i])


def _port_list(value: str) -> tuple[str, ...]:
    """Istio's port list: each item trimmed, 0-65535, none empty. Two values pass Istio's
    check and then fail its iptables run: `*` (`--dport *`) and blanks only (`--dport` with no
    port). Both are refused here, so the pod fails as it does with Istio."""
    if value == WILDCARD:
        raise ValueError("'*' is not allowed here (iptables rejects '--dport *')")
    if not value:
        return ()
    text = value.strip()
    if not text:
        raise ValueError("no port in a value of blanks (iptables rejects '--dport' without one)")
    ports: list[str] = []
    for item in text.split(","):
        port = item.strip()
        if not (port.isascii() and port.isdigit()) or int(port) > 65535:
            raise ValueError(f"port {item!r} is not a number 0-65535")
        ports.append(port)  # repeats too: Istio writes a rule for each
    return tuple(ports)


def _port_list_or_wildcard(value: str) -> tuple[str, ...] | cfg.Wildcard:
    return WILDCARD if value == WILDCARD else _port_list(value)


def _cidr_list(value: str) -> tuple[str, ...]:
    """Istio's CIDR list: comma separated, nothing trimmed, each a Go netip prefix."""
    if not value:
        return ()
    return tuple(_prefix(item) for item in value.split(","))


def _cidr_list_or_wildcard(value: str) -> tuple[str, ...] | cfg.Wildcard:
    return WILDCARD if value == WILDCARD else _cidr_list(value)


def _prefix(item: str) -> str:
    """Go's netip.ParsePrefix: address/bits, no zone, bits decimal without a leading zero."""
    address, slash, bits = item.rpartition("/")
    if not slash:
        raise ValueError(f"{item!r} is not a CIDR (no '/')")
    if "%" in address:
        raise ValueError(f"{item!r}: zones are not allowed in a CIDR")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"{item!r}: {address!r} is not an IP address") from None
    if not (bits.isascii() and bits.isdigit()) or (len(bits) > 1 and bits[0] == "0"):
        raise ValueError(f"{item!r}: bad prefix length {bits!r}")
    if int(bits) > ip.max_prefixlen:
        raise ValueError(f"{item!r}: prefix length out of range")
    return cfg.canonical_cidr(item)


def _interfaces(value: str) -> tuple[str, ...]:
    """Istio's interface list: items trimmed, none empty, letter first, at most 15 chars."""
    if not value:
        return ()
    names: list[str] = []
    for item in value.split(","):
        name = item.strip()
        if not name:
            raise ValueError("empty interface name")
        if len(name) > 15:
            raise ValueError(f"interface name {name!r} too long (max 15 chars)")
        if not (name.isascii() and INTERFACE_NAME.fullmatch(name)):
            raise ValueError(f"interface name {name!r} contains invalid characters")
        names.append(name)
    return tuple(names)


# --- helpers ----------------------------------------------------------------------------------


def _proxy_id(value: object) -> str:
    # The container's runAsUser/runAsGroup unless unset or 0; the pod's securityContext is not
    # read (Istio reads only the istio-proxy container's).
    if isinstance(value, int) and not isinstance(value, bool) and value != 0:
        return str(value)
    return DEFAULT_PROXY_ID


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    """A boolean env var of the proxy, as Istio reads it: unset or unparsable is false."""
    if name not in env:
        return False
    value = parse_bool(env[name])
    if value is None:
        log.warning("cannot parse %s=%r on %s; taken as false", name, env[name], PROXY_CONTAINER)
    return value is True


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_map(value: object) -> dict[str, str]:
    return {str(k): "" if v is None else str(v) for k, v in _mapping(value).items()}


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key) or []
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []
