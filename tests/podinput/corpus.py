"""Hostile values and every input a pod controls, shared by the hostile tier's tests.

`HOSTILE` is what a pod owner bent on leaving the mesh, or on reading the node's files, would
write: line and command separators, comment and quote characters, rule fragments, an nft
`include`, over-long and non-ASCII values. `INPUTS` lists each pod-controlled input of each
mode with how to put a value into a pod manifest and how the agent's errors name it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agent.excerpt import excerpt

EXPLOIT = (
    "eth9 -j RETURN\n-I ISTIO_OUTPUT 1 -j ACCEPT\n-I ISTIO_PRERT 1 -j ACCEPT\n-A ISTIO_PRERT -i lo"
)
"""The value that took an ambient pod out of the mesh before the pod parser."""

HOSTILE: dict[str, str] = {
    "exploit": EXPLOIT,
    "newline": "eth0\n-A ISTIO_OUTPUT -j ACCEPT",
    "cr": "eth0\r-A ISTIO_OUTPUT -j ACCEPT",
    "tab": "eth0\t-j",
    "nul": "eth0\x00",
    "spaces": "eth0 -j RETURN",
    "semicolon": "eth0;flush",
    "hash": "eth0#x",
    "dquote": 'eth0"',
    "squote": "eth0'",
    "include": 'include "/etc/passwd"',
    "jump": "-j ACCEPT",
    "append": "-A ISTIO_OUTPUT",
    "insert": "-I PREROUTING 1",
    "long": "a" * 300,
    "fullwidth": "\uff18\uff10",  # FULLWIDTH DIGIT EIGHT, ZERO: '80' to isdigit()
    "escaped-newline": "eth0\\n-A",
    "brace": "{ 53 }",
}
"""Each refused for every input below (no grammar takes any of them)."""

Mode = Literal["sidecar", "ambient"]
Manifest = dict[str, Any]

STATUS = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}


def sidecar_pod() -> Manifest:
    """An injected pod that sidecar mode redirects (its rules are programmed)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "app",
            "uid": "uid-sidecar",
            "labels": {},
            "annotations": dict(STATUS),
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "app:1"},
                {"name": "istio-proxy", "image": "proxyv2:1", "args": ["proxy", "sidecar"]},
            ]
        },
        "status": {"podIPs": [{"ip": "10.1.2.3"}], "podIP": "10.1.2.3"},
    }


def ambient_pod() -> Manifest:
    """A pod in an ambient namespace (`app`): ambient mode enrolls it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "app",
            "uid": "uid-ambient",
            "labels": {},
            "annotations": {},
            "resourceVersion": "1",
        },
        "spec": {"serviceAccountName": "web", "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Pending", "podIPs": [{"ip": "10.1.2.3"}], "podIP": "10.1.2.3"},
    }


def _proxy(pod: Manifest) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")


def _annotation(key: str) -> Callable[[Manifest, object], None]:
    def put(pod: Manifest, value: object) -> None:
        pod["metadata"]["annotations"][key] = value

    return put


def _label(key: str) -> Callable[[Manifest, object], None]:
    def put(pod: Manifest, value: object) -> None:
        pod["metadata"]["labels"][key] = value

    return put


def _env(name: str) -> Callable[[Manifest, object], None]:
    def put(pod: Manifest, value: object) -> None:
        _proxy(pod).setdefault("env", []).append({"name": name, "value": value})

    return put


def _security(field: str) -> Callable[[Manifest, object], None]:
    def put(pod: Manifest, value: object) -> None:
        _proxy(pod).setdefault("securityContext", {})[field] = value

    return put


def _pod_ips(pod: Manifest, value: object) -> None:
    pod["status"]["podIPs"] = [{"ip": value}]
    pod["status"]["podIP"] = value


@dataclass(frozen=True)
class Input:
    mode: Mode
    where: str
    """How the agent's error names the input."""
    put: Callable[[Manifest, object], None]
    extra: tuple[object, ...] = ()
    """Values beyond HOSTILE refused for this input (JSON of another type, out of range)."""

    @property
    def id(self) -> str:
        return f"{self.mode}:{self.where}"

    def pod(self, value: object) -> Manifest:
        pod = sidecar_pod() if self.mode == "sidecar" else ambient_pod()
        self.put(pod, value)
        return pod

    def values(self) -> dict[str, object]:
        return {**HOSTILE, **{f"extra-{i}": v for i, v in enumerate(self.extra)}}


SIDECAR_ANNOTATIONS = (
    "sidecar.istio.io/interceptionMode",
    "traffic.sidecar.istio.io/includeOutboundIPRanges",
    "traffic.sidecar.istio.io/excludeOutboundIPRanges",
    "traffic.sidecar.istio.io/includeInboundPorts",
    "traffic.sidecar.istio.io/excludeInboundPorts",
    "traffic.sidecar.istio.io/includeOutboundPorts",
    "traffic.sidecar.istio.io/excludeOutboundPorts",
    "traffic.sidecar.istio.io/excludeInterfaces",
    "traffic.sidecar.istio.io/kubevirtInterfaces",
    "istio.io/reroute-virtual-interfaces",
    "sidecar.istio.io/inject",
)
SIDECAR_ENV = ("ISTIO_META_DNS_CAPTURE", "INVALID_DROP", "ISTIO_DUAL_STACK", "DISABLE_ENVOY")
AMBIENT_ANNOTATIONS = (
    "ambient.istio.io/bypass-inbound-capture",
    "ambient.istio.io/dns-capture",
    "istio.io/reroute-virtual-interfaces",
)
NOT_AN_INT = (-1, 2**32, True, "1337")

INPUTS: tuple[Input, ...] = (
    *(Input("sidecar", f"annotation {key}", _annotation(key)) for key in SIDECAR_ANNOTATIONS),
    Input("sidecar", "label sidecar.istio.io/inject", _label("sidecar.istio.io/inject")),
    *(Input("sidecar", f"istio-proxy env {name}", _env(name)) for name in SIDECAR_ENV),
    Input(
        "sidecar",
        "istio-proxy securityContext runAsUser",
        _security("runAsUser"),
        NOT_AN_INT,
    ),
    Input(
        "sidecar",
        "istio-proxy securityContext runAsGroup",
        _security("runAsGroup"),
        NOT_AN_INT,
    ),
    Input("sidecar", "status.podIPs", _pod_ips, ("10.0.0.1/24", "fe80::1%eth0")),
    *(Input("ambient", f"annotation {key}", _annotation(key)) for key in AMBIENT_ANNOTATIONS),
    Input("ambient", "status.podIPs", _pod_ips, ("10.0.0.1/24", "fe80::1%eth0")),
)


def cases(mode: Mode | None = None) -> list[tuple[Input, str, object]]:
    """(input, value id, value) for every input of `mode` (all modes: None) and value."""
    return [
        (item, name, value)
        for item in INPUTS
        if mode is None or item.mode == mode
        for name, value in item.values().items()
    ]


def refusal_problems(message: str, item: Input, value: object) -> list[str]:
    """What is wrong with a refusal's message: it must name the input, show the value only as
    a bounded escaped excerpt, and be one printable line."""
    problems = []
    message = message.removesuffix("\n")
    if item.where not in message:
        problems.append(f"does not name {item.where!r}")
    if isinstance(value, str) and excerpt(value) not in message:
        problems.append(f"does not show the excerpt {excerpt(value)}")
    if any(not (" " <= ch <= "~") for ch in message):
        problems.append("holds a control or non-ASCII character")
    if isinstance(value, str) and len(value) > 80 and value in message:
        problems.append("holds the whole over-long value")
    return problems


def clone(pod: Manifest) -> Manifest:
    return copy.deepcopy(pod)
