"""What the caches keep of an object: only the fields some part of the agent reads, each bounded.

A pod as the API server sends it is mostly what the agent never reads (managedFields, volumes,
images, probes, conditions, container statuses), and its owner can make it large: 1.4 MB of
container args costs some 16 MB as Python objects. Its slim record keeps the API's JSON shape
(camelCase dicts), so every reader works on it as on the full object, but its size has a bound
whatever the pod's: what a pod controls is still checked by its one parser (agent/podinput/).

- Containers: the first `istio-proxy` and the first `istio-init` of `containers` and of
  `initContainers` (no reader looks at another); of the proxy, the first two args (its
  `proxy <type>`), the env vars agent.podinput reads (the last entry of each name, the one read)
  and its runAsUser / runAsGroup. Of `istio-init`, its name.
- Labels and annotations: the keys some reader looks up (PodFields: the settings name some).
- Status: phase, IPs and the statuses of the repair's validation init container.
- Every kept string is at most TEXT_LIMIT characters and every list at most LIST_LIMIT items.
  A longer string is kept as a `Cut` (agent.podinput.pod): the parser refuses the pod, naming
  the value, rather than decide on part of it; a value of another kind than the field's (which
  the API server never sends) is a Cut too.

A field is kept by naming it in a shape: `KEEP` keeps a scalar; a dict shape keeps those keys of
a mapping, and of each mapping in a list; a function keeps what it returns of the value.

`reading_of(shape)` is what must be read of the API's JSON for the shape (agent.pods.skim), so
that a fat pod's unread fields are skipped in its text, never built: each function of a shape is
a `Kept` that says what it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config import RepairSettings, Settings
from agent.label_selectors import (
    DATAPLANE_MODE_LABEL,
    DEFAULT_ENABLEMENT_SELECTORS,
    EnablementSelector,
)
from agent.podinput import pod as podinput
from agent.podinput.pod import Cut
from agent.pods import skim

KEEP = True
Shape = dict[str, "Shape | bool | Callable[[Any], Any]"]

TEXT_LIMIT = 8192
"""Characters kept of a string; a longer one is a Cut. Istio's injector writes every value the
agent parses in a few hundred; Kubernetes' own limits are 63 (label value) and 253 (name)."""
LIST_LIMIT = 16
"""Items kept of a list the API server fills (pod IPs: at most 2; init container statuses)."""

AMBIENT_REDIRECTION = "ambient.istio.io/redirection"
"""Ambient's record of a pod's state (agent.ambient.enrollment reads it)."""
INIT_CONTAINER = "istio-init"
"""A pod with it sets up its own rules (agent.rules.sidecar.pod reads its name only)."""
ZTUNNEL_APP_LABEL = "app"
"""Labels a ztunnel pod (agent.ambient.enrollment)."""
ANNOTATIONS = frozenset((*podinput.ANNOTATIONS, AMBIENT_REDIRECTION))
"""Every annotation the agent reads (sidecar.istio.io/status by repair and ambient too)."""
LABELS = frozenset((*podinput.LABELS, DATAPLANE_MODE_LABEL, ZTUNNEL_APP_LABEL))
"""The labels every agent reads; PodFields adds those its settings name."""


def _selector_keys(selectors: Iterable[EnablementSelector]) -> frozenset[str]:
    keys = set()
    for selector in selectors:
        keys |= {key for key, _ in selector.podSelector.matchLabels}
        keys |= {req.key for req in selector.podSelector.matchExpressions}
    return frozenset(keys)


@dataclass(frozen=True)
class PodFields:
    """What the settings make the agent read of a pod, beyond what every agent reads."""

    labels: frozenset[str] = field(
        default_factory=lambda: (
            _selector_keys(DEFAULT_ENABLEMENT_SELECTORS) | {RepairSettings().labelKey}
        )
    )
    """Label keys: the ambient enablement selectors' pod keys, the repair label."""
    init_container: str = RepairSettings().initContainerName
    """Repair's validation init container ("" any: its first LIST_LIMIT statuses are kept)."""

    @classmethod
    def of(cls, settings: Settings) -> PodFields:
        return cls(
            labels=_selector_keys(settings.ambient.enablementSelectors)
            | {settings.repair.labelKey},
            init_container=settings.repair.initContainerName,
        )


def text(value: Any) -> Any:
    """A scalar as kept: a string of at most TEXT_LIMIT characters, else a Cut."""
    if isinstance(value, str):
        if len(value) <= TEXT_LIMIT:
            return value
        return Cut(value[:TEXT_LIMIT], f"longer than the {TEXT_LIMIT} characters the agent keeps")
    if value is None or isinstance(value, bool | int | float):
        return value
    kind = type(value).__name__
    return Cut(f"<{kind}>", f"a {kind}, not a single value")  # equals no constant read


@dataclass(frozen=True)
class Kept:
    """A field kept by a function (`keep`), and what the function reads of it (`reading`)."""

    keep: Callable[[Any], Any]
    reading: skim.Reading

    def __call__(self, value: Any) -> Any:
        return self.keep(value)


def reading_of(shape: Shape) -> dict[str, skim.Reading]:
    """What `slim(obj, shape)` reads of an object: the rest need not be built (agent.pods.skim)."""
    return {key: _reading(sub) for key, sub in shape.items()}


def _reading(sub: Shape | bool | Callable[[Any], Any]) -> skim.Reading:
    if isinstance(sub, dict):
        return reading_of(sub)
    return sub.reading if isinstance(sub, Kept) else skim.KEEP


def _named(*names: str) -> Callable[[Any], bool]:
    """An item with one of those names (a tuple: a name of another type compares unequal)."""
    return lambda item: isinstance(item, Mapping) and item.get("name") in names


def _name(item: Any) -> Any:
    return item["name"]


def slim(obj: Any, shape: Shape) -> Any:
    """The fields of `obj` that `shape` names (a new object; `obj` is left as it was)."""
    if isinstance(obj, dict):
        return {key: _field(obj[key], sub) for key, sub in shape.items() if key in obj}
    if isinstance(obj, list):
        return [slim(item, shape) for item in obj[:LIST_LIMIT]]
    return text(obj)


def _field(value: Any, shape: Shape | bool | Callable[[Any], Any]) -> Any:
    if isinstance(shape, dict):
        return slim(value, shape)
    return shape(value) if callable(shape) else text(value)


def _keys(keys: frozenset[str]) -> Kept:
    """Those keys of a mapping (a label's or annotation's value is a string)."""

    def kept(value: Any) -> Any:
        if not isinstance(value, Mapping):
            return {}
        return {key: text(value[key]) for key in keys if key in value}

    return Kept(kept, dict.fromkeys(keys, skim.KEEP))


def _all_containers(value: Any) -> list[dict[str, Any]]:
    """The first istio-proxy (its read fields) and the first istio-init (its name)."""
    kept: dict[str, dict[str, Any]] = {}
    for container in value if isinstance(value, list) else ():
        if not isinstance(container, Mapping):
            continue
        name = container.get("name")
        if name == podinput.PROXY_CONTAINER and name not in kept:
            kept[name] = _proxy(container)
        elif name == INIT_CONTAINER and name not in kept:
            kept[name] = {"name": name}
    return list(kept.values())


_containers = Kept(
    _all_containers,
    skim.Items(
        {
            "name": KEEP,
            "args": skim.Items(KEEP, first=2),
            "env": skim.Items(
                {"name": KEEP, "value": KEEP}, where=_named(*podinput.PROXY_ENV), unique=_name
            ),
            "securityContext": {"runAsUser": KEEP, "runAsGroup": KEEP},
        },
        where=_named(podinput.PROXY_CONTAINER, INIT_CONTAINER),
        unique=_name,
        last=False,
    ),
)


def _proxy(container: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {"name": podinput.PROXY_CONTAINER}
    args = container.get("args")
    if isinstance(args, list):
        kept["args"] = [text(arg) for arg in args[:2]]  # `proxy <type>`: all that is read
    elif args is not None:
        kept["args"] = text(args)
    env = container.get("env")
    if isinstance(env, list):
        last: dict[str, dict[str, Any]] = {}
        for item in env:
            if isinstance(item, Mapping) and item.get("name") in podinput.PROXY_ENV:
                entry = last[item["name"]] = {"name": item["name"]}
                if "value" in item:  # absent and null read alike; kept as sent
                    entry["value"] = text(item["value"])
        kept["env"] = list(last.values())
    security = container.get("securityContext")
    if isinstance(security, Mapping):
        kept["securityContext"] = slim(security, {"runAsUser": KEEP, "runAsGroup": KEEP})
    return kept


_TERMINATED: Shape = {"exitCode": KEEP, "reason": KEEP, "message": KEEP}
_INIT_STATUS: Shape = {
    "name": KEEP,
    "state": {"terminated": _TERMINATED},
    "lastState": {"terminated": _TERMINATED},
}


def _init_statuses(name: str) -> Kept:
    """Repair reads the statuses of its validation init container only (of all, when "")."""

    def wanted(status: Any) -> bool:
        return isinstance(status, Mapping) and (not name or status.get("name") == name)

    def kept(value: Any) -> Any:
        if not isinstance(value, list):
            return text(value)
        return slim([s for s in value if wanted(s)], _INIT_STATUS)

    return Kept(kept, skim.Items(reading_of(_INIT_STATUS), where=wanted, first=LIST_LIMIT))


def pod_shape(fields: PodFields) -> Shape:
    """What the pod server, repair, readiness, status and ambient read of a pod."""
    return {
        "apiVersion": KEEP,
        "kind": KEEP,
        "metadata": {
            "name": KEEP,
            "namespace": KEEP,
            "uid": KEEP,
            "resourceVersion": KEEP,
            "deletionTimestamp": KEEP,
            "labels": _keys(LABELS | fields.labels),
            "annotations": _keys(ANNOTATIONS),
        },
        "spec": {
            "nodeName": KEEP,
            "hostNetwork": KEEP,
            "serviceAccountName": KEEP,  # ambient: the pod's identity, told to ztunnel
            "containers": _containers,
            "initContainers": _containers,
        },
        "status": {
            "phase": KEEP,
            "podIP": KEEP,
            "podIPs": {"ip": KEEP},
            "initContainerStatuses": _init_statuses(fields.init_container),
        },
    }


POD: Shape = pod_shape(PodFields())
"""A pod as an agent with the default settings reads it."""


_whole = Kept(lambda value: value, KEEP)


NAMESPACE: Shape = {
    "apiVersion": KEEP,
    "kind": KEEP,
    "metadata": {"name": KEEP, "resourceVersion": KEEP, "labels": _whole},
}
"""Enrolment reads a namespace's labels only (the version tells a relist what changed). A
namespace is the cluster's administrators', not a pod owner's: its labels are kept whole."""
