"""Which nodes a DaemonSet's pod should run on, as the DaemonSet controller decides it
(`NodeShouldRunDaemonPod`): the pod template's node selector and required node affinity match
the node's labels, and every NoSchedule/NoExecute taint of the node is tolerated, counting the
tolerations the controller adds to every daemon pod."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SELECTOR, TAINT = "selector", "taint"

DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


@dataclass(frozen=True)
class Excluded:
    kind: str
    """SELECTOR (the chart's nodeSelector/affinity) or TAINT (not tolerated)."""
    why: str


def excluded(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> Excluded | None:
    """None when the DaemonSet should run its pod on `node`, else why not."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return Excluded(SELECTOR, f"nodeSelector {key}={value} does not match the node")
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_term_matches(t, labels, str(meta.get("name", ""))) for t in terms):
        return Excluded(SELECTOR, "required node affinity does not match the node")
    tolerations = [*(pod_spec.get("tolerations") or []), *DAEMON_TOLERATIONS]
    if pod_spec.get("hostNetwork"):
        tolerations.append(HOST_NETWORK_TOLERATION)
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return Excluded(TAINT, f"taint {_taint(taint)} is not tolerated")
    return None


def _taint(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """k8s.io/api/core/v1 Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if not key:
        return False
    return str(toleration.get("value") or "") == str(taint.get("value") or "")


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing
    if not all(_expression(e, labels.get(str(e.get("key")))) for e in expressions):
        return False
    return all(e.get("key") == "metadata.name" and _expression(e, node_name) for e in fields)


def _expression(expr: Mapping[str, Any], value: str | None) -> bool:
    operator = expr.get("operator")
    values: Sequence[str] = [str(v) for v in expr.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def target_node(pod: Mapping[str, Any]) -> str:
    """The node a pod is on, or for an unscheduled daemon pod the node it is for (the
    controller pins each pod with a matchFields metadata.name term)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return ""
