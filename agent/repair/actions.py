"""What repair does to a broken pod: redirect in place, delete or label it, with an Event."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import Counter

from agent.excerpt import bounded

log = logging.getLogger(__name__)

PODS_REPAIRED = Counter(
    "istio_cni_repair_pods_repaired",
    "Pods handled by the repair loop, by action type and result.",
    ["type", "result"],
)

EVENT_SOURCE = "istio-cni-repair"
MAX_EVENT_MESSAGE = 1024
"""An Event's message: one escaped line at most this long (errors may quote a tool or a pod)."""


class CoreApi(Protocol):
    """The part of kubernetes.client.CoreV1Api that repair uses."""

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def patch_namespaced_pod_status(
        self, name: str, namespace: str, body: Any, **kwargs: Any
    ) -> Any: ...
    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> Any: ...


def delete_pod(core: CoreApi, pod: Mapping[str, Any]) -> None:
    """Delete the pod we looked at, not a successor of the same name (UID + RV preconditions)."""
    meta = pod["metadata"]
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
    }
    core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)


def label_pod(core: CoreApi, pod: Mapping[str, Any], *, key: str, value: str) -> None:
    """Label through pods/status: it may change metadata and needs less privilege than pods."""
    meta = pod["metadata"]
    patch = {"metadata": {"labels": {key: value}}}
    core.patch_namespaced_pod_status(meta["name"], meta["namespace"], patch)


def record_event(
    core: CoreApi, pod: Mapping[str, Any], *, reason: str, message: str, node_name: str
) -> None:
    """A Warning Event on the pod, so `kubectl describe pod` shows what repair did."""
    meta = pod["metadata"]
    event = event_for(pod, reason=reason, message=message, node_name=node_name)
    try:
        core.create_namespaced_event(meta["namespace"], event)
    except Exception as e:  # an Event is best effort: never fail the repair for it
        log.warning(
            "cannot record event %s for pod %s/%s: %s", reason, meta["namespace"], meta["name"], e
        )


def event_for(
    pod: Mapping[str, Any], *, reason: str, message: str, node_name: str
) -> dict[str, Any]:
    """The Event as this node's agent reports it (`source.host`: the node)."""
    meta = pod["metadata"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": bounded(message, MAX_EVENT_MESSAGE),
        "type": "Warning",
        "source": {"component": EVENT_SOURCE, "host": node_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
