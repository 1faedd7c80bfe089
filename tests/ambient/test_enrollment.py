"""Ambient enrollment decisions, rule by rule, against Istio's (cni/pkg/util enablement_selector.go,
podutil.go; cni/pkg/nodeagent/informers.go). Pure Python: no marker."""

from __future__ import annotations

from typing import Any

import pytest

from agent.ambient.enrollment import (
    REDIRECTION_ANNOTATION,
    RedirectionState,
    annotation_patch,
    namespace_change_matters,
    namespace_matches,
    pod_ips,
    pod_update_action,
    redirection_annotation_state,
    redirection_state,
    release_on_delete,
    should_enroll,
)
from agent.label_selectors import (
    DEFAULT_ENABLEMENT_SELECTORS,
    EnablementSelector,
    LabelSelector,
    LabelSelectorRequirement,
    parse_enablement_selectors,
    selector_matches,
)

MODE = "istio.io/dataplane-mode"
DEFAULT = DEFAULT_ENABLEMENT_SELECTORS


def pod(
    name: str = "app",
    ns: str = "shop",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    host_network: bool = False,
    phase: str = "Running",
    ips: tuple[str, ...] = ("10.0.0.5",),
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"hostNetwork": host_network, "containers": [{"name": "app"}]},
        "status": {
            "phase": phase,
            "podIPs": [{"ip": ip} for ip in ips],
            **({"podIP": ips[0]} if ips else {}),
        },
    }


def namespace(name: str = "shop", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}}


AMBIENT_NS = namespace(labels={MODE: "ambient"})
PLAIN_NS = namespace()
SIDECAR = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}

CASES: dict[str, tuple[dict[str, Any], dict[str, Any] | None, bool, str]] = {
    "namespace-ambient": (pod(), AMBIENT_NS, True, "enablement selector 1 matches"),
    "pod-ambient-plain-namespace": (
        pod(labels={MODE: "ambient"}),
        PLAIN_NS,
        True,
        "enablement selector 0 matches",
    ),
    "pod-ambient-namespace-ambient": (
        pod(labels={MODE: "ambient"}),
        AMBIENT_NS,
        True,
        "enablement selector 0 matches",
    ),
    "pod-none-opts-out": (
        pod(labels={MODE: "none"}),
        AMBIENT_NS,
        False,
        "pod opts out with istio.io/dataplane-mode=none",
    ),
    "neither-labelled": (pod(), PLAIN_NS, False, "no enablement selector matches"),
    "namespace-none": (
        pod(),
        namespace(labels={MODE: "none"}),
        False,
        "no enablement selector matches",
    ),
    "namespace-other-value": (
        pod(),
        namespace(labels={MODE: "sidecar"}),
        False,
        "no enablement selector matches",
    ),
    "pod-other-value-namespace-ambient": (
        pod(labels={MODE: "other"}),
        AMBIENT_NS,
        True,
        "enablement selector 1 matches",
    ),
    "no-namespace-object": (
        pod(labels={MODE: "ambient"}),
        None,
        True,
        "enablement selector 0 matches",
    ),
    "host-network": (
        pod(labels={MODE: "ambient"}, host_network=True),
        AMBIENT_NS,
        False,
        "pod uses the host network",
    ),
    "sidecar": (
        pod(annotations=SIDECAR),
        AMBIENT_NS,
        False,
        "pod has a sidecar (sidecar.istio.io/status)",
    ),
    "sidecar-even-when-pod-says-ambient": (
        pod(labels={MODE: "ambient"}, annotations=SIDECAR),
        PLAIN_NS,
        False,
        "pod has a sidecar",
    ),
    "succeeded": (
        pod(phase="Succeeded"),
        AMBIENT_NS,
        False,
        "pod has terminated (phase Succeeded)",
    ),
    "failed": (pod(phase="Failed"), AMBIENT_NS, False, "pod has terminated (phase Failed)"),
    "pending-phase-enrolls": (
        pod(phase="Pending", ips=()),
        AMBIENT_NS,
        True,
        "enablement selector 1 matches",
    ),
    "ztunnel": (
        pod("ztunnel-x", "istio-system", labels={"app": "ztunnel"}),
        namespace("istio-system", {MODE: "ambient"}),
        False,
        "pod is a ztunnel",
    ),
    "app-ztunnel-elsewhere-is-a-pod": (
        pod(labels={"app": "ztunnel"}),
        AMBIENT_NS,
        True,
        "enablement selector 1 matches",
    ),
    "excluded-namespace": (
        pod("a", "kube-system", labels={MODE: "ambient"}),
        namespace("kube-system"),
        False,
        "namespace kube-system is excluded",
    ),
}


@pytest.mark.parametrize(
    ("the_pod", "the_ns", "enroll", "reason"), CASES.values(), ids=CASES.keys()
)
def test_should_enroll_follows_istio(
    the_pod: dict[str, Any], the_ns: dict[str, Any] | None, enroll: bool, reason: str
) -> None:
    decision = should_enroll(the_pod, the_ns, DEFAULT, exclude_namespaces=("kube-system",))
    assert decision.enroll is enroll
    assert reason in decision.reason


def test_a_terminating_pod_is_decided_like_any_other() -> None:
    p = pod()
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert should_enroll(p, AMBIENT_NS, DEFAULT).enroll


def test_the_system_namespace_is_configurable() -> None:
    z = pod("ztunnel-x", "kube-system", labels={"app": "ztunnel"})
    assert should_enroll(z, namespace("kube-system", {MODE: "ambient"}), DEFAULT).enroll
    assert not should_enroll(
        z, namespace("kube-system", {MODE: "ambient"}), DEFAULT, system_namespace="kube-system"
    ).enroll


def test_no_selectors_enroll_nothing() -> None:
    assert not should_enroll(pod(labels={MODE: "ambient"}), AMBIENT_NS, ()).enroll


def test_empty_selectors_match_everything() -> None:
    everything = (EnablementSelector(),)
    assert should_enroll(pod(), PLAIN_NS, everything).enroll
    # ... but not host-network or sidecar pods.
    assert not should_enroll(pod(host_network=True), PLAIN_NS, everything).enroll
    assert not should_enroll(pod(annotations=SIDECAR), PLAIN_NS, everything).enroll


def test_custom_selectors_decide_and_none_is_only_a_label_then() -> None:
    selectors = parse_enablement_selectors(
        [
            {
                "podSelector": {"matchLabels": {"team": "pay"}},
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "env", "operator": "In", "values": ["prod", "stage"]}
                    ]
                },
            },
        ]
    )
    prod = namespace(labels={"env": "prod"})
    assert should_enroll(pod(labels={"team": "pay"}), prod, selectors).enroll
    assert not should_enroll(
        pod(labels={"team": "pay"}), namespace(labels={"env": "dev"}), selectors
    ).enroll
    assert not should_enroll(pod(), prod, selectors).enroll
    assert should_enroll(pod(labels={"team": "pay", MODE: "none"}), prod, selectors).enroll


OPERATOR_CASES = [
    ("In", ("a", "b"), {"k": "a"}, True),
    ("In", ("a",), {"k": "c"}, False),
    ("In", ("a",), {}, False),
    ("NotIn", ("a",), {"k": "a"}, False),
    ("NotIn", ("a",), {"k": "b"}, True),
    ("NotIn", ("a",), {}, True),
    ("Exists", (), {"k": ""}, True),
    ("Exists", (), {}, False),
    ("DoesNotExist", (), {}, True),
    ("DoesNotExist", (), {"k": "x"}, False),
]


@pytest.mark.parametrize(("op", "values", "labels", "matches"), OPERATOR_CASES)
def test_match_expression_operators(
    op: Any, values: tuple[str, ...], labels: dict[str, str], matches: bool
) -> None:
    sel = LabelSelector(matchExpressions=(LabelSelectorRequirement("k", op, values),))
    assert selector_matches(sel, labels) is matches


def test_match_labels_need_key_and_value_and_all_terms() -> None:
    sel = LabelSelector(
        matchLabels=(("a", "1"), ("b", "")),
        matchExpressions=(LabelSelectorRequirement("c", "Exists"),),
    )
    assert selector_matches(sel, {"a": "1", "b": "", "c": "x"})
    assert not selector_matches(sel, {"a": "1", "c": "x"})
    assert not selector_matches(sel, {"a": "2", "b": "", "c": "x"})
    assert not selector_matches(sel, {"a": "1", "b": ""})
    assert selector_matches(LabelSelector(), {})


def test_namespace_matches_skips_empty_namespace_selectors() -> None:
    assert namespace_matches({MODE: "ambient"}, DEFAULT)
    assert not namespace_matches({}, DEFAULT)
    assert not namespace_matches({}, (EnablementSelector(),))


def test_namespace_change_matters_only_when_the_match_flips() -> None:
    assert namespace_change_matters(None, PLAIN_NS, DEFAULT)
    assert namespace_change_matters(PLAIN_NS, AMBIENT_NS, DEFAULT)
    assert namespace_change_matters(AMBIENT_NS, PLAIN_NS, DEFAULT)
    assert not namespace_change_matters(PLAIN_NS, namespace(labels={"x": "y"}), DEFAULT)
    assert not namespace_change_matters(
        AMBIENT_NS, namespace(labels={MODE: "ambient", "x": "y"}), DEFAULT
    )


def enrolled(state: str, **kwargs: Any) -> dict[str, Any]:
    return pod(annotations={REDIRECTION_ANNOTATION: state}, **kwargs)


UPDATE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, str, str]] = {
    "labelled-namespace-adds": (pod(), AMBIENT_NS, None, "add", "enablement selector 1"),
    "no-ip-yet-waits": (pod(ips=()), AMBIENT_NS, None, "none", "no IP yet"),
    "enrolled-stays": (enrolled("enabled"), AMBIENT_NS, None, "none", "no change needed"),
    "unlabelled-namespace-removes": (
        enrolled("enabled"),
        PLAIN_NS,
        None,
        "remove",
        "should not be",
    ),
    "pod-opts-out-removes": (
        enrolled("enabled", labels={MODE: "none"}),
        AMBIENT_NS,
        None,
        "remove",
        "opts out",
    ),
    "pending-retries-add": (enrolled("pending"), AMBIENT_NS, None, "add", "selector"),
    "pending-not-wanted-removes": (enrolled("pending"), PLAIN_NS, None, "remove", "pending"),
    "terminated-enrolled-released": (
        enrolled("enabled", phase="Succeeded"),
        AMBIENT_NS,
        None,
        "remove-deleted",
        "terminated",
    ),
    "terminated-pending-released": (
        enrolled("pending", phase="Failed"),
        AMBIENT_NS,
        None,
        "remove-deleted",
        "terminated",
    ),
    "terminated-never-enrolled": (pod(phase="Succeeded"), AMBIENT_NS, None, "none", "terminated"),
    "not-wanted-not-enrolled": (pod(), PLAIN_NS, None, "none", "no change needed"),
    "other-annotation-value-is-not-enrolled": (
        enrolled("disabled"),
        PLAIN_NS,
        None,
        "none",
        "no change needed (none)",
    ),
    "ip-change-syncs-probe-set": (
        enrolled("enabled", ips=("10.0.0.9",)),
        AMBIENT_NS,
        enrolled("enabled"),
        "sync-host-probe",
        "10.0.0.9",
    ),
    "same-ips-no-sync": (enrolled("enabled"), AMBIENT_NS, enrolled("enabled"), "none", "no change"),
    "excluded-namespace-removes": (
        enrolled("enabled", ns="kube-system"),
        namespace("kube-system", {MODE: "ambient"}),
        None,
        "remove",
        "excluded",
    ),
    "ztunnel-left-alone": (
        pod("z", "istio-system", labels={"app": "ztunnel"}),
        namespace("istio-system", {MODE: "ambient"}),
        None,
        "none",
        "ztunnel",
    ),
}


@pytest.mark.parametrize(
    ("the_pod", "the_ns", "old", "action", "reason"), UPDATE_CASES.values(), ids=UPDATE_CASES.keys()
)
def test_pod_update_action_follows_istios_informer(
    the_pod: dict[str, Any],
    the_ns: dict[str, Any],
    old: dict[str, Any] | None,
    action: str,
    reason: str,
) -> None:
    """Each case's annotation stands for the state the agent recorded for the pod."""
    got = pod_update_action(
        the_pod,
        the_ns,
        DEFAULT,
        state=redirection_state(the_pod),
        old_pod=old,
        exclude_namespaces=("kube-system",),
    )
    assert got.action == action
    assert reason in got.reason


@pytest.mark.parametrize(
    ("annotation", "recorded", "the_ns"),
    [
        ({}, "enabled", AMBIENT_NS),  # found enrolled at start-up, or the annotation removed
        ({"ambient.istio.io/redirection": "pending"}, "enabled", AMBIENT_NS),
        ({"ambient.istio.io/redirection": "enabled"}, "none", PLAIN_NS),  # a stale claim
    ],
    ids=["enrolled-unannotated", "enrolled-annotated-pending", "stale-claim"],
)
def test_an_annotation_that_is_not_the_pods_state_is_written_again(
    annotation: dict[str, str], recorded: RedirectionState, the_ns: dict[str, Any]
) -> None:
    """istiod reads `enabled` to send the pod HBONE: the annotation must say what the agent
    did, at start-up (reconcile) and whenever it changes."""
    the_pod = pod(annotations=annotation)
    got = pod_update_action(the_pod, the_ns, DEFAULT, state=recorded)
    assert got.action == "annotate", got.reason


@pytest.mark.hostile
@pytest.mark.parametrize(
    ("claimed", "recorded", "the_ns", "action"),
    [
        ("enabled", "none", AMBIENT_NS, "add"),  # a claim does not keep it out of the mesh
        ("pending", "enabled", AMBIENT_NS, "annotate"),  # the record's `enabled` written back
        ("disabled", "enabled", PLAIN_NS, "remove"),  # removing the claim hides nothing
        ("enabled", "none", PLAIN_NS, "annotate"),  # the claim removed, nothing enrolled
    ],
    ids=["claims-enabled", "claims-pending", "drops-claim", "claims-outside-mesh"],
)
def test_the_pods_own_annotation_never_decides(
    claimed: str, recorded: RedirectionState, the_ns: dict[str, Any], action: str
) -> None:
    the_pod = enrolled(claimed)
    got = pod_update_action(the_pod, the_ns, DEFAULT, state=recorded)
    assert got.action == action, got.reason
    assert release_on_delete(the_pod, PLAIN_NS, DEFAULT, state="none") is False


@pytest.mark.parametrize(
    ("the_pod", "the_ns", "release"),
    [
        (enrolled("enabled"), PLAIN_NS, True),
        (enrolled("pending"), PLAIN_NS, True),
        (pod(), AMBIENT_NS, True),
        (pod(), PLAIN_NS, False),
        (pod(host_network=True), AMBIENT_NS, False),
    ],
)
def test_release_on_delete(the_pod: dict[str, Any], the_ns: dict[str, Any], release: bool) -> None:
    state = redirection_state(the_pod)  # the case's annotation as the agent's record
    assert release_on_delete(the_pod, the_ns, DEFAULT, state=state) is release


@pytest.mark.parametrize(
    ("annotations", "state"),
    [
        ({}, "none"),
        ({REDIRECTION_ANNOTATION: "enabled"}, "enabled"),
        ({REDIRECTION_ANNOTATION: "pending"}, "pending"),
        ({REDIRECTION_ANNOTATION: "disabled"}, "none"),
        ({REDIRECTION_ANNOTATION: "Enabled"}, "none"),
        ({REDIRECTION_ANNOTATION: ""}, "none"),
    ],
)
def test_redirection_state_as_istio_reads_it(annotations: dict[str, str], state: str) -> None:
    assert redirection_state(pod(annotations=annotations)) == state
    assert redirection_annotation_state(pod(annotations=annotations)) == state


def test_redirection_state_of_odd_objects() -> None:
    assert redirection_state(None) == "none"
    assert redirection_state({"metadata": {"annotations": None}}) == "none"
    assert redirection_state({}) == "none"


@pytest.mark.parametrize(
    ("state", "data", "ignore_not_found"),
    [
        (True, b'{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}', False),
        (
            "enabled",
            b'{"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}}',
            False,
        ),
        (
            "pending",
            b'{"metadata":{"annotations":{"ambient.istio.io/redirection":"pending"}}}',
            False,
        ),
        (False, b'{"metadata":{"annotations":{"ambient.istio.io/redirection":null}}}', True),
        ("none", b'{"metadata":{"annotations":{"ambient.istio.io/redirection":null}}}', True),
    ],
)
def test_annotation_patch_is_istios(state: Any, data: bytes, ignore_not_found: bool) -> None:
    patch = annotation_patch(state)
    assert patch.data == data  # byte for byte Istio's annotation*Patch
    assert patch.subresource == "status"
    assert patch.content_type == "application/merge-patch+json"
    assert patch.ignore_not_found is ignore_not_found


def test_pod_ips_prefers_pod_ips_then_pod_ip() -> None:
    assert pod_ips(pod(ips=("10.0.0.1", "fd00::1"))) == ("10.0.0.1", "fd00::1")
    assert pod_ips({"status": {"podIP": "10.0.0.2"}}) == ("10.0.0.2",)
    assert pod_ips({"status": {}}) == () and pod_ips({}) == ()
