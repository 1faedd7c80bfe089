"""Which pods get redirect rules, and with which settings: the decisions of Istio's CNI plugin.

`decide` answers "would Istio's plugin program this pod at all?" from the pod manifest;
`capture_config_for_pod` turns the pod's `sidecar.istio.io/*` and `traffic.sidecar.istio.io/*`
annotations and its istio-proxy container into a CaptureConfig. Bad annotation values raise
InvalidAnnotationError naming the annotation and the value: the pod fails to start rather than
run without the capture its owner asked for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from agent.errors import InvalidAnnotationError
from agent.rules import config as cfg
from agent.rules.config import WILDCARD, CaptureConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

PROXY_CONTAINER = "istio-proxy"
INIT_CONTAINER = "istio-init"
DEFAULT_PROXY_ID = "1337"

INJECT = "sidecar.istio.io/inject"
STATUS = "sidecar.istio.io/status"
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
PROXY_CONFIG = "proxy.istio.io/config"
INCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
INCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/includeInboundPorts"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
INCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/includeOutboundPorts"
EXCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/excludeOutboundPorts"
EXCLUDE_INTERFACES = "traffic.sidecar.istio.io/excludeInterfaces"
KUBEVIRT_INTERFACES = "traffic.sidecar.istio.io/kubevirtInterfaces"
REROUTE_VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"

PROXY_STATUS_PORT = "15020"
ALWAYS_EXCLUDED_INBOUND = ("15020", "15021", "15090")
"""Status, health and Prometheus ports of the proxy: Istio always exempts them inbound."""


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
    if spec.get("hostNetwork") is True:
        return Decision(False, "pod uses the host network")
    names = [str(c.get("name")) for c in _containers(spec, "containers")]
    names += [str(c.get("name")) for c in _containers(spec, "initContainers")]
    if INIT_CONTAINER in names:
        return Decision(False, f"pod has the {INIT_CONTAINER} container, which sets up rules")
    proxy = proxy_container(pod)
    if proxy is None:
        return Decision(False, f"pod has no {PROXY_CONTAINER} container")
    env = proxy_env(proxy)
    if _bool_or_none(env.get("DISABLE_ENVOY")) is True:
        return Decision(False, f"DISABLE_ENVOY is set on {PROXY_CONTAINER}")
    args = proxy.get("args") or []
    if isinstance(args, list) and len(args) >= 2 and args[0] == "proxy" and args[1] != "sidecar":
        return Decision(False, f"proxy type is {args[1]}, not sidecar")
    labels = _str_map(meta.get("labels"))
    annotations = _str_map(meta.get("annotations"))
    inject = labels.get(INJECT, annotations.get(INJECT, ""))
    if inject and _bool_or_none(inject) is False:
        return Decision(False, f"injection disabled ({INJECT}={inject})")
    if STATUS not in annotations:
        return Decision(False, f"no {STATUS} annotation: the sidecar was not injected")
    return Decision(True, "pod has an injected sidecar")


def capture_config_for_pod(
    pod: Mapping[str, Any], *, ipv6: bool, dns_servers: Sequence[str]
) -> CaptureConfig:
    """The capture settings Istio's plugin derives for this pod."""
    meta = _mapping(pod.get("metadata"))
    a = _str_map(meta.get("annotations"))
    proxy = proxy_container(pod) or {}
    env = proxy_env(proxy)
    security = _mapping(proxy.get("securityContext"))
    exclude_in = _annotation(a, EXCLUDE_INBOUND_PORTS, PROXY_STATUS_PORT, _ports)
    exclude_in += tuple(p for p in ALWAYS_EXCLUDED_INBOUND if p not in exclude_in)
    reroute_key = (
        REROUTE_VIRTUAL_INTERFACES if REROUTE_VIRTUAL_INTERFACES in a else KUBEVIRT_INTERFACES
    )
    dns = _dns_capture(env, a)
    servers_v4, servers_v6 = cfg.split_dns_servers(dns_servers) if dns else ((), ())
    return CaptureConfig(
        proxy_uids=(_proxy_id(security.get("runAsUser")),),
        proxy_gids=(_proxy_id(security.get("runAsGroup")),),
        interception_mode=_annotation(a, INTERCEPTION_MODE, "REDIRECT", _mode),
        outbound_ip_ranges_include=_annotation(
            a, INCLUDE_OUTBOUND_IP_RANGES, WILDCARD, _cidrs_or_wildcard
        ),
        outbound_ip_ranges_exclude=_annotation(a, EXCLUDE_OUTBOUND_IP_RANGES, "", _cidrs),
        inbound_ports_exclude=exclude_in,
        inbound_ports_include=_annotation(a, INCLUDE_INBOUND_PORTS, WILDCARD, _ports_or_wildcard),
        outbound_ports_exclude=_annotation(a, EXCLUDE_OUTBOUND_PORTS, PROXY_STATUS_PORT, _ports),
        outbound_ports_include=_annotation(a, INCLUDE_OUTBOUND_PORTS, "", _ports),
        exclude_interfaces=_annotation(a, EXCLUDE_INTERFACES, "", cfg.parse_interfaces),
        reroute_virtual_interfaces=_annotation(a, reroute_key, "", cfg.parse_interfaces),
        redirect_dns=dns,
        # The plugin cannot know the pod's resolvers, so it captures all port-53 traffic.
        capture_all_dns=dns,
        dns_servers_v4=servers_v4,
        dns_servers_v6=servers_v6,
        drop_invalid=_bool_or_none(env.get("INVALID_DROP")) is True,
        enable_ipv6=ipv6,
    )


def proxy_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The istio-proxy container: a regular container or a native sidecar (init container)."""
    spec = _mapping(pod.get("spec"))
    for key in ("containers", "initContainers"):
        for container in _containers(spec, key):
            if container.get("name") == PROXY_CONTAINER:
                return container
    return None


def proxy_env(container: Mapping[str, Any]) -> dict[str, str]:
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


# --- helpers ----------------------------------------------------------------------------------


def _annotation(
    annotations: Mapping[str, str], key: str, default: str, parse: Callable[[str], T]
) -> T:
    value = annotations.get(key, default)
    try:
        return parse(value)
    except ValueError as e:
        raise InvalidAnnotationError(f"annotation {key}: invalid value {value!r}: {e}") from None


def _mode(value: str) -> cfg.InterceptionMode:
    if value not in ("REDIRECT", "TPROXY"):
        raise ValueError("interception mode must be REDIRECT or TPROXY")
    return "TPROXY" if value == "TPROXY" else "REDIRECT"


def _ports(value: str) -> tuple[str, ...]:
    ports = cfg.parse_ports(value, allow_wildcard=False)
    assert ports != WILDCARD
    return ports


def _ports_or_wildcard(value: str) -> tuple[str, ...] | cfg.Wildcard:
    return cfg.parse_ports(value, allow_wildcard=True)


def _cidrs(value: str) -> tuple[str, ...]:
    cidrs = cfg.parse_cidrs(value.replace(" ", ""), allow_wildcard=False)
    assert cidrs != WILDCARD
    return cidrs


def _cidrs_or_wildcard(value: str) -> tuple[str, ...] | cfg.Wildcard:
    return cfg.parse_cidrs(value.replace(" ", ""), allow_wildcard=True)


def _proxy_id(value: object) -> str:
    # Istio uses the container's runAsUser/runAsGroup unless unset or 0 (root never bypasses).
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    return DEFAULT_PROXY_ID


def _dns_capture(env: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """ISTIO_META_DNS_CAPTURE on the proxy; else the same key in proxy.istio.io/config."""
    if "ISTIO_META_DNS_CAPTURE" in env:
        value = _bool_or_none(env["ISTIO_META_DNS_CAPTURE"])
        if value is None:
            log.warning(
                "cannot parse ISTIO_META_DNS_CAPTURE=%r; DNS capture off",
                env["ISTIO_META_DNS_CAPTURE"],
            )
        return value is True
    raw = annotations.get(PROXY_CONFIG)
    if not raw:
        return False
    try:
        proxy_config = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise InvalidAnnotationError(
            f"annotation {PROXY_CONFIG}: invalid value {raw!r}: not YAML: {e}"
        ) from None
    metadata = _mapping(_mapping(proxy_config).get("proxyMetadata"))
    return _bool_or_none(str(metadata.get("ISTIO_META_DNS_CAPTURE", ""))) is True


def _bool_or_none(text: str | None) -> bool | None:
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_map(value: object) -> dict[str, str]:
    return {str(k): "" if v is None else str(v) for k, v in _mapping(value).items()}


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key) or []
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []
