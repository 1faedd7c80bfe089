"""Which pods are in the ambient mesh: the decisions of Istio's CNI node agent, as pure functions.

Pods and namespaces are dicts as the Kubernetes API returns them (like
`agent.rules.sidecar.pod`). Each function follows Istio (cni/pkg/util: enablement_selector.go,
podutil.go; cni/pkg/nodeagent: informers.go, meshdataplane_linux.go; cni/pkg/plugin/plugin.go):

- `should_enroll`: would Istio redirect this pod to ztunnel? The enablement selectors over pod
  and namespace labels (Istio's default: pod `istio.io/dataplane-mode=ambient`, or namespace
  `ambient` and pod not `none`), never a host-network pod or a pod with a sidecar
  (`sidecar.istio.io/status`), never a pod of an excluded namespace, a terminated pod (phase
  Succeeded/Failed) or a ztunnel pod (`app=ztunnel` in the system namespace).
- `pod_update_action` / `release_on_delete` / `namespace_change_matters`: what the agent's pod
  and namespace watch does on each event, the annotation made to match the agent's record.
- `redirection_state` and `annotation_patch`: the `ambient.istio.io/redirection` annotation Istio
  reads and writes (through the pods/status subresource, as a JSON merge patch). The pod's owner
  can write it too: decisions take the state the agent recorded (`state=`), never the
  annotation; it is read only to find the pods a previous agent claimed, whose netns is then
  looked at (agent.ambient.mesh reconcile).

A pod that is being deleted (deletionTimestamp) but still running is decided like any other, as
in Istio: its release comes with the DELETE event or its terminal phase.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.label_selectors import DATAPLANE_MODE_LABEL, EnablementSelector, selector_matches

REDIRECTION_ANNOTATION = "ambient.istio.io/redirection"
"""Set by the agent (never by users) to the pod's actual redirection state."""
SIDECAR_STATUS_ANNOTATION = "sidecar.istio.io/status"
"""Set by Istio's injector: the pod has a sidecar, and ambient leaves it alone."""
DATAPLANE_MODE_AMBIENT = "ambient"
DATAPLANE_MODE_NONE = "none"
ZTUNNEL_APP = "ztunnel"
"""Value of the `app` label that marks ztunnel pods in the system namespace."""
DEFAULT_SYSTEM_NAMESPACE = "istio-system"
TERMINAL_PHASES = ("Succeeded", "Failed")

RedirectionState = Literal["enabled", "pending", "none"]
"""enabled: rules in place and ztunnel took the pod; pending: rules in place, no ztunnel ack yet
(the pod still needs cleaning up on removal); none: anything else, annotation absent or another
value (Istio compares with "enabled" and "pending" only)."""

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Decision:
    enroll: bool
    reason: str


@dataclass(frozen=True)
class AnnotationPatch:
    """The patch Istio sends: `core.patch_namespaced_pod_status(name, ns, body,
    _content_type=content_type)`; pods/status may change metadata and needs less privilege."""

    body: dict[str, Any]
    subresource: str = "status"
    content_type: str = MERGE_PATCH
    ignore_not_found: bool = False
    """Removal only: a pod that is gone needs no annotation removed."""

    @property
    def data(self) -> bytes:
        """The body as Istio writes it (compact JSON)."""
        return json.dumps(self.body, separators=(",", ":")).encode()


PodAction = Literal["add", "remove", "remove-deleted", "sync-host-probe", "annotate", "none"]


@dataclass(frozen=True)
class Action:
    """What the watch does on a pod update. remove-deleted: the pod terminated, release it as a
    deleted pod (ztunnel and host side only; use the *old* pod, whose status still has its IPs);
    sync-host-probe: an enrolled pod's IPs changed, re-add them to the host probe address set;
    annotate: the pod's `ambient.istio.io/redirection` is not its state (written by hand, or a
    write that failed): write the state's (`enabled`, or none)."""

    action: PodAction
    reason: str


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _str_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return _str_map(_meta(obj).get("labels"))


def annotations_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return _str_map(_meta(obj).get("annotations"))


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    return str(status.get("phase") or "") if isinstance(status, Mapping) else ""


def is_terminated(pod: Mapping[str, Any]) -> bool:
    """Istio's `kube.CheckPodTerminal`: phase Succeeded or Failed (a finished job's pod)."""
    return _phase(pod) in TERMINAL_PHASES


def is_ztunnel_pod(
    pod: Mapping[str, Any], system_namespace: str = DEFAULT_SYSTEM_NAMESPACE
) -> bool:
    """Istio's `IsZtunnelPod`: label app=ztunnel in the system namespace."""
    return (
        _meta(pod).get("namespace") == system_namespace and labels_of(pod).get("app") == ZTUNNEL_APP
    )


def pod_ips(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Istio's `GetPodIPsIfPresent`: status.podIPs, else status.podIP, else none."""
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return ()
    ips = [
        str(p.get("ip"))
        for p in status.get("podIPs") or []
        if isinstance(p, Mapping) and p.get("ip")
    ]
    if ips:
        return tuple(ips)
    return (str(status["podIP"]),) if status.get("podIP") else ()


def selectors_match(
    pod: Mapping[str, Any],
    namespace: Mapping[str, Any] | None,
    selectors: Sequence[EnablementSelector],
) -> Decision:
    """Istio's `CompiledEnablementSelectors.Matches`, with the reason: host network and sidecar
    pods never, else the first entry whose pod and namespace selectors both match."""
    if _spec(pod).get("hostNetwork") is True:
        return Decision(False, "pod uses the host network (its netns is the node's)")
    if SIDECAR_STATUS_ANNOTATION in annotations_of(pod):
        return Decision(False, f"pod has a sidecar ({SIDECAR_STATUS_ANNOTATION})")
    pod_labels, ns_labels = labels_of(pod), labels_of(namespace)
    for i, sel in enumerate(selectors):
        if selector_matches(sel.podSelector, pod_labels) and selector_matches(
            sel.namespaceSelector, ns_labels
        ):
            return Decision(
                True,
                f"enablement selector {i} matches the pod and its namespace ({_describe(sel)})",
            )
    mode = pod_labels.get(DATAPLANE_MODE_LABEL)
    if mode == DATAPLANE_MODE_NONE:
        return Decision(
            False,
            f"pod opts out with {DATAPLANE_MODE_LABEL}={DATAPLANE_MODE_NONE}; "
            "no enablement selector matches",
        )
    return Decision(False, "no enablement selector matches the pod's and its namespace's labels")


def should_enroll(
    pod: Mapping[str, Any],
    namespace: Mapping[str, Any] | None,
    selectors: Sequence[EnablementSelector],
    *,
    exclude_namespaces: Collection[str] = (),
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
) -> Decision:
    """Should this pod be redirected to ztunnel now (Istio's `shouldBeEnabled`, plus the ztunnel
    and terminated-pod rules of its watch)? `namespace` is the pod's Namespace object."""
    ns_name = str(_meta(pod).get("namespace") or "default")
    if is_ztunnel_pod(pod, system_namespace):
        return Decision(False, f"pod is a ztunnel (app={ZTUNNEL_APP} in {system_namespace})")
    if is_terminated(pod):
        return Decision(False, f"pod has terminated (phase {_phase(pod)})")
    if ns_name in exclude_namespaces:
        return Decision(False, f"namespace {ns_name} is excluded (excludeNamespaces)")
    return selectors_match(pod, namespace, selectors)


def namespace_may_enroll(
    pod: Mapping[str, Any],
    selectors: Sequence[EnablementSelector],
    *,
    exclude_namespaces: Collection[str] = (),
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
) -> bool:
    """Could the labels of the pod's namespace make it enrolled? Nothing of the pod's keeps it
    out (`should_enroll`'s other rules) and some selector with a namespace selector matches the
    pod's own labels."""
    ns_name = str(_meta(pod).get("namespace") or "default")
    if (
        ns_name in exclude_namespaces
        or is_ztunnel_pod(pod, system_namespace)
        or is_terminated(pod)
        or _spec(pod).get("hostNetwork") is True
        or SIDECAR_STATUS_ANNOTATION in annotations_of(pod)
    ):
        return False
    labels = labels_of(pod)
    return any(
        not s.namespaceSelector.empty and selector_matches(s.podSelector, labels) for s in selectors
    )


def namespace_matches(
    ns_labels: Mapping[str, str], selectors: Sequence[EnablementSelector]
) -> bool:
    """Istio's `MatchesNamespace`: a non-empty namespace selector of some entry matches."""
    return any(
        not s.namespaceSelector.empty and selector_matches(s.namespaceSelector, ns_labels)
        for s in selectors
    )


def namespace_change_matters(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], selectors: Sequence[EnablementSelector]
) -> bool:
    """Re-examine the namespace's pods (Istio: on add, or when an update flips
    `namespace_matches`). `old` is None for a namespace the watch has just seen."""
    if old is None:
        return True
    return namespace_matches(labels_of(old), selectors) != namespace_matches(
        labels_of(new), selectors
    )


def pod_update_action(
    pod: Mapping[str, Any],
    namespace: Mapping[str, Any] | None,
    selectors: Sequence[EnablementSelector],
    *,
    state: RedirectionState,
    old_pod: Mapping[str, Any] | None = None,
    exclude_namespaces: Collection[str] = (),
    system_namespace: str = DEFAULT_SYSTEM_NAMESPACE,
) -> Action:
    """Istio's informer on a pod update (or a namespace change re-examining its pods): compares
    the intent (`should_enroll`) with the pod's `state` as the agent recorded it (Istio reads the
    redirection annotation, which the pod's owner can set: a pod claiming `enabled` would then
    never be captured). Pod adds need nothing (the plugin's ADD or start-up covers them)."""
    if is_ztunnel_pod(pod, system_namespace):
        return Action("none", "pod is a ztunnel")
    if state != "none" and is_terminated(pod):
        return Action("remove-deleted", f"pod was {state} and has terminated (phase {_phase(pod)})")
    decision = should_enroll(
        pod,
        namespace,
        selectors,
        exclude_namespaces=exclude_namespaces,
        system_namespace=system_namespace,
    )
    if state == "enabled" and decision.enroll and old_pod is not None:
        ips = pod_ips(pod)
        if ips and sorted(ips) != sorted(pod_ips(old_pod)):
            return Action("sync-host-probe", f"enrolled pod's IPs changed to {', '.join(ips)}")
    if is_terminated(pod):
        return Action("none", f"pod has terminated (phase {_phase(pod)})")
    if (state == "enabled") == decision.enroll and state != "pending":
        claim = redirection_state(pod)
        if claim != state:
            return Action("annotate", f"annotation says {claim}, the pod is {state}")
        return Action("none", f"no change needed ({state}): {decision.reason}")
    if not decision.enroll:
        return Action("remove", f"pod is {state} but should not be: {decision.reason}")
    if not pod_ips(pod):
        return Action("none", "pod should be enrolled but has no IP yet")
    return Action("add", decision.reason)


def release_on_delete(
    pod: Mapping[str, Any],
    namespace: Mapping[str, Any] | None,
    selectors: Sequence[EnablementSelector],
    *,
    state: RedirectionState,
) -> bool:
    """Istio on a pod DELETE (from the event's pod, not the cache): release it from ztunnel when
    it was enrolled or pending (as the agent recorded it), or matches the selectors."""
    return state != "none" or selectors_match(pod, namespace, selectors).enroll


def redirection_state(pod: Mapping[str, Any] | None) -> RedirectionState:
    """The pod's `ambient.istio.io/redirection` as Istio reads it (PodFullyEnrolled,
    PodPartiallyEnrolled): "enabled", "pending", or "none" for absent and any other value.
    A claim only: whoever may update the pod may write it."""
    value = annotations_of(pod).get(REDIRECTION_ANNOTATION)
    if value == "enabled":
        return "enabled"
    if value == "pending":
        return "pending"
    return "none"


def redirection_annotation_state(pod: Mapping[str, Any] | None) -> RedirectionState:
    """Alias of `redirection_state`."""
    return redirection_state(pod)


def annotation_patch(state: RedirectionState | bool) -> AnnotationPatch:
    """The merge patch Istio applies on pods/status: True or "enabled" once ztunnel took the pod,
    "pending" when the rules are in but ztunnel did not answer, False or "none" to remove the
    annotation (a pod already gone is fine)."""
    if state is True:
        state = "enabled"
    elif state is False:
        state = "none"
    value = None if state == "none" else state
    body = {"metadata": {"annotations": {REDIRECTION_ANNOTATION: value}}}
    return AnnotationPatch(body=body, ignore_not_found=value is None)


def _describe(sel: EnablementSelector) -> str:
    parts = []
    for what, s in (("pod", sel.podSelector), ("namespace", sel.namespaceSelector)):
        terms = [f"{k}={v}" for k, v in s.matchLabels]
        terms += [
            f"{r.key} {r.operator}" + (f" [{', '.join(r.values)}]" if r.values else "")
            for r in s.matchExpressions
        ]
        parts.append(f"{what}: {' and '.join(terms) if terms else 'any'}")
    return "; ".join(parts)
