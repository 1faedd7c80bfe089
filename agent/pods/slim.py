"""What the caches keep of an object: only the fields some part of the agent reads.

A pod as the API server sends it is mostly what the agent never reads (managedFields, volumes,
images, probes, conditions, container statuses): a full pod costs several KiB in Python dicts,
its slim record a few hundred bytes. The record keeps the API's JSON shape (camelCase dicts),
so every reader works on it as on the full object, and keeps the values it holds as the API
server sent them: what a pod controls is still checked by its one parser (agent/podinput/).

A field is kept by naming it in a shape: `KEEP` keeps its value whole; a dict shape keeps those
keys of a mapping, and of each mapping in a list (items that are not mappings stay as they are,
for the parser to refuse or ignore); a value of another kind than the shape expects is kept
whole, for the same reason.
"""

from __future__ import annotations

from typing import Any

KEEP = True
Shape = dict[str, "Shape | bool"]

_CONTAINER: Shape = {
    "name": KEEP,
    "args": KEEP,  # a proxy of another type than `sidecar` is not redirected
    "env": {"name": KEEP, "value": KEEP},  # `valueFrom` reads as "" either way
    "securityContext": {"runAsUser": KEEP, "runAsGroup": KEEP},
}
_TERMINATED: Shape = {"exitCode": KEEP, "reason": KEEP, "message": KEEP}

POD: Shape = {
    "apiVersion": KEEP,
    "kind": KEEP,
    "metadata": {
        "name": KEEP,
        "namespace": KEEP,
        "uid": KEEP,
        "resourceVersion": KEEP,
        "deletionTimestamp": KEEP,
        "labels": KEEP,
        "annotations": KEEP,
    },
    "spec": {
        "nodeName": KEEP,
        "hostNetwork": KEEP,
        "containers": _CONTAINER,
        "initContainers": _CONTAINER,
    },
    "status": {
        "phase": KEEP,
        "podIP": KEEP,
        "podIPs": KEEP,
        # repair: the validation init container's exit
        "initContainerStatuses": {
            "name": KEEP,
            "state": {"terminated": _TERMINATED},
            "lastState": {"terminated": _TERMINATED},
        },
    },
}
"""What the pod server, repair, readiness and ambient read of a pod."""

NAMESPACE: Shape = {
    "apiVersion": KEEP,
    "kind": KEEP,
    "metadata": {"name": KEEP, "resourceVersion": KEEP, "labels": KEEP},
}
"""Enrolment reads a namespace's labels only (the version tells a relist what changed)."""


def slim(obj: Any, shape: Shape) -> Any:
    """The fields of `obj` that `shape` names (a new object; `obj` is left as it was)."""
    if isinstance(obj, dict):
        kept: dict[str, Any] = {}
        for key, sub in shape.items():
            if key in obj:
                value = obj[key]
                kept[key] = value if sub is KEEP or not isinstance(sub, dict) else slim(value, sub)
        return kept
    if isinstance(obj, list):
        return [slim(item, shape) if isinstance(item, dict) else item for item in obj]
    return obj
