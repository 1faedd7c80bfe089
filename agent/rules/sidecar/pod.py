"""Which pods get redirect rules, and with which settings: the decisions of Istio's CNI plugin.

`decide` answers "would Istio's plugin program this pod at all?" from the pod manifest;
`capture_config_for_pod` turns the pod's `sidecar.istio.io/*` and `traffic.sidecar.istio.io/*`
annotations and its istio-proxy container into a CaptureConfig; `ipv6_for_pod` says whether the
pod gets IPv6 rules. Each follows Istio's plugin (cni/pkg/plugin: plugin.go, kubernetes.go,
sidecar_redirect.go) input by input, including what it ignores. Every value is read through
agent.podinput, the parser ambient mode uses too: a refused value raises InvalidPodInputError
naming the input and an excerpt of the value, and the pod fails to start rather than run
without the capture its owner asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent import constants
from agent.excerpt import excerpt
from agent.podinput import grammar
from agent.podinput import pod as podinput
from agent.podinput.tokens import Id
from agent.rules.sidecar import hostfacts
from agent.rules.sidecar.capture import CaptureConfig

PROXY_CONTAINER = podinput.PROXY_CONTAINER
INIT_CONTAINER = "istio-init"
DEFAULT_PROXY_ID = Id(constants.PROXY_ID)

INJECT = podinput.INJECT
STATUS = podinput.STATUS
DISABLE_ENVOY_ENV = podinput.DISABLE_ENVOY_ENV
REROUTE_VIRTUAL_INTERFACES = podinput.REROUTE_VIRTUAL_INTERFACES
KUBEVIRT_INTERFACES = podinput.KUBEVIRT_INTERFACES

proxy_container = podinput.proxy_container
proxy_env = podinput.proxy_env
dual_stack = podinput.dual_stack


@dataclass(frozen=True)
class Decision:
    redirect: bool
    reason: str


def decide(pod: Mapping[str, Any], *, exclude_namespaces: Collection[str]) -> Decision:
    """Would Istio's CNI plugin (sidecar mode) program this pod's network namespace?"""
    meta = podinput.mapping(pod.get("metadata"))
    spec = podinput.mapping(pod.get("spec"))
    namespace = str(meta.get("namespace") or "default")
    if namespace in exclude_namespaces:
        return Decision(False, f"namespace {namespace} is excluded")
    # Not an input of Istio's plugin: the runtime never calls CNI for a host-network pod. Said
    # here so that `rules --pod` explains such a pod instead of printing rules nobody applies.
    if spec.get("hostNetwork") is True:
        return Decision(False, "pod uses the host network")
    names = [str(c.get("name")) for c in podinput.containers(spec, "containers")]
    names += [str(c.get("name")) for c in podinput.containers(spec, "initContainers")]
    if INIT_CONTAINER in names:
        return Decision(False, f"pod has the {INIT_CONTAINER} container, which sets up rules")
    proxy = proxy_container(pod)
    if proxy is None:
        return Decision(False, f"pod has no {PROXY_CONTAINER} container")
    if podinput.disable_envoy(proxy):
        return Decision(False, f"{DISABLE_ENVOY_ENV} is set on {PROXY_CONTAINER}")
    kind = proxy_type(proxy)
    if kind not in ("", "sidecar"):
        return Decision(False, f"proxy type is {excerpt(kind)}, not sidecar")
    inject = podinput.inject_value(pod)
    if inject in grammar.GO_FALSE:
        return Decision(False, f"injection disabled ({INJECT}={inject})")
    if STATUS not in podinput.annotations_of(pod):
        return Decision(False, f"no {STATUS} annotation: the sidecar was not injected")
    return Decision(True, "pod has an injected sidecar")


def proxy_type(proxy: Mapping[str, Any]) -> str:
    """The `<type>` of the proxy's `proxy <type>` args; "" when the args are not of that form."""
    args = proxy.get("args")
    if isinstance(args, list) and len(args) >= 2 and args[0] == "proxy":
        return str(args[1])
    return ""


def capture_config_for_pod(
    pod: Mapping[str, Any], *, ipv6: bool, dns_servers: Sequence[str] = ()
) -> CaptureConfig:
    """The capture settings Istio's plugin derives for this pod.

    `ipv6`: the answer of `ipv6_for_pod`. `dns_servers` is accepted and unused: with DNS capture
    Istio's plugin captures all port-53 traffic and never reads the resolvers.
    """
    del dns_servers
    got = podinput.sidecar_input(pod)
    return CaptureConfig(
        proxy_uids=(_proxy_id(got.proxy_uid),),
        proxy_gids=(_proxy_id(got.proxy_gid),),
        interception_mode=got.interception_mode,
        outbound_ip_ranges_include=got.include_ranges,
        outbound_ip_ranges_exclude=got.exclude_ranges,
        inbound_ports_exclude=got.exclude_inbound,
        inbound_ports_include=got.include_inbound,
        outbound_ports_exclude=got.exclude_outbound,
        outbound_ports_include=got.include_outbound,
        exclude_interfaces=got.exclude_interfaces,
        reroute_virtual_interfaces=got.reroute_interfaces,
        redirect_dns=got.dns_capture,
        capture_all_dns=got.dns_capture,
        drop_invalid=got.drop_invalid,
        enable_ipv6=ipv6,
    )


# --- IPv6 -------------------------------------------------------------------------------------


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
    """status.podIPs (else status.podIP) of a pod manifest: the pod's addresses when it runs
    (each an IP address, else the pod is refused)."""
    return list(podinput.pod_ips(pod))


def _is_ipv6(address: str) -> bool:
    return ":" in address


# --- helpers ----------------------------------------------------------------------------------


def _proxy_id(value: Id | None) -> Id:
    # The container's runAsUser/runAsGroup unless unset or 0; the pod's securityContext is not
    # read (Istio reads only the istio-proxy container's).
    return DEFAULT_PROXY_ID if value is None or value == "0" else value
