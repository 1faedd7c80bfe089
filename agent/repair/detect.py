"""Which pods on this node need repair: pure decisions on the pod object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
# istio-validation exits with this code when it finds traffic is not redirected.
VALIDATION_FAILED_EXIT_CODE = 126


def validation_failed(pod: Mapping[str, Any], *, init_container_name: str) -> bool:
    """True when the pod's validation init container last failed as Istio's does without rules.

    A container that currently shows a successful termination is never broken: a crash-looping
    one reports its failure in `lastState` while it waits for the next restart.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if SIDECAR_STATUS_ANNOTATION not in annotations:
        return False
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != init_container_name:
            continue
        current = (status.get("state") or {}).get("terminated")
        if current and (current.get("reason") == "Completed" or current.get("exitCode") == 0):
            continue
        last = (status.get("lastState") or {}).get("terminated")
        if last and last.get("exitCode") == VALIDATION_FAILED_EXIT_CODE:
            return True
    return False


def is_running_with_addresses(pod: Mapping[str, Any]) -> bool:
    """A pod whose sandbox exists: it has an IP, so its netns can be found by address."""
    status = pod.get("status") or {}
    return bool(pod_ips(pod)) and status.get("phase") in ("Pending", "Running")


def pod_ips(pod: Mapping[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    ips = [entry.get("ip") for entry in status.get("podIPs") or [] if entry.get("ip")]
    if not ips and status.get("podIP"):
        ips = [status["podIP"]]
    return [str(ip) for ip in ips]


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
