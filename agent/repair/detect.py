"""Which pods on this node need repair: pure decisions on the pod object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.rules.sidecar import pod as pod_rules

SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
# istio-validation exits with this code when it finds traffic is not redirected.
VALIDATION_FAILED_EXIT_CODE = 126


def validation_failed(
    pod: Mapping[str, Any],
    *,
    init_container_name: str,
    exit_code: int = VALIDATION_FAILED_EXIT_CODE,
    termination_message: str = "",
) -> bool:
    """True when the pod's validation init container last failed as Istio's does without rules
    (Istio's repair filter): its last termination has `exit_code` (0: any) and, when set, the
    `termination_message`. A container that currently shows a successful termination is never
    broken: a crash-looping one reports its failure in `lastState` while it waits to restart.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if SIDECAR_STATUS_ANNOTATION not in annotations:
        return False
    wanted_message = termination_message.strip()
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if init_container_name and status.get("name") != init_container_name:
            continue
        current = (status.get("state") or {}).get("terminated")
        if current and (current.get("reason") == "Completed" or current.get("exitCode") == 0):
            continue
        last = (status.get("lastState") or {}).get("terminated")
        if not last:
            continue
        if exit_code and last.get("exitCode") != exit_code:
            continue
        if wanted_message and str(last.get("message") or "").strip() != wanted_message:
            continue
        return True
    return False


def is_running_with_addresses(pod: Mapping[str, Any]) -> bool:
    """A pod whose sandbox exists: it has an IP, which its netns must hold."""
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


def check_sidecar_inputs(pod: Mapping[str, Any]) -> None:
    """Raise InvalidPodInputError, naming the value, when the plugin's ADD would refuse one of
    the values it reads from this pod to program it (its IPs, ISTIO_DUAL_STACK, the capture
    annotations): repair agrees with the ADD and never acts on a pod whose values it refuses."""
    pod_rules.pod_ips(pod)
    pod_rules.dual_stack(pod)
    pod_rules.capture_config_for_pod(pod, ipv6=False)
