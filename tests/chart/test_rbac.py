"""Least privilege: the agent's rights follow the enabled features."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.helm import Helm
from tests.chart.conftest import of_kind, only

pytestmark = pytest.mark.chart


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every rule."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


READ = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "nodes", "get"),
}
EVENTS = {("", "events", "create"), ("", "events", "patch")}  # refusals', repair's Events
BASE = READ | EVENTS


@pytest.mark.parametrize(
    ("sets", "extra"),
    [
        ([], set()),
        (["repair.mode=repair-in-place"], set()),
        (["repair.mode=delete"], {("", "pods", "delete")}),
        (["repair.mode=label"], {("", "pods/status", "patch")}),
        (["repair.mode=delete", "repair.enabled=false"], None),
        (["repair.mode=label", "repair.enabled=false"], None),
    ],
    ids=["default", "repair-in-place", "delete", "label", "delete-disabled", "label-disabled"],
)
def test_cluster_role_grants_only_what_the_repair_mode_needs(
    helm: Helm, sets: list[str], extra: set[tuple[str, str, str]] | None
) -> None:
    """`extra` None: repair off (Events stay: a refused ADD reports one)."""
    role = only(helm.render(sets=sets), "ClusterRole")
    expected = BASE if extra is None else BASE | extra
    assert grants(role["rules"]) == expected
    assert not any(r.get("resourceNames") for r in role["rules"])


def test_cluster_role_is_bound_to_the_agents_service_account(helm: Helm) -> None:
    docs = helm.render()
    binding, sa = only(docs, "ClusterRoleBinding"), only(docs, "ServiceAccount")
    role = only(docs, "ClusterRole")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": sa["metadata"]["name"],
            "namespace": "kube-system",
        }
    ]
    ds = only(docs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_daemonset_get_is_limited_to_the_own_daemonset_in_its_namespace(helm: Helm) -> None:
    docs = helm.render()
    role = only(docs, "Role")
    ds = only(docs, "DaemonSet")
    assert role["metadata"]["namespace"] == ds["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": [ds["metadata"]["name"]],
            "verbs": ["get", "list", "watch"],
        }
    ]
    (binding,) = [b for b in of_kind(docs, "RoleBinding") if b["roleRef"]["kind"] == "Role"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


@pytest.mark.parametrize(
    ("sets", "bound"),
    [
        ([], None),
        (["psp_cluster_role=restricted-psp-user"], "restricted-psp-user"),
        (["platform=openshift"], "system:openshift:scc:privileged"),
        (
            ["platform=openshift", "psp_cluster_role=system:openshift:scc:hostaccess"],
            "system:openshift:scc:hostaccess",
        ),
    ],
    ids=["none", "psp", "openshift-scc", "openshift-other-scc"],
)
def test_psp_cluster_role_is_bound_only_when_set(
    helm: Helm, sets: list[str], bound: str | None
) -> None:
    docs = helm.render(sets=sets)
    to_cluster_roles = [
        b for b in of_kind(docs, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"
    ]
    if bound is None:
        assert to_cluster_roles == []
        return
    (binding,) = to_cluster_roles
    assert binding["roleRef"]["name"] == bound
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["subjects"][0]["name"] == only(docs, "ServiceAccount")["metadata"]["name"]
    # The binding grants nothing cluster-wide.
    assert len(of_kind(docs, "ClusterRoleBinding")) == 1


VAP = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"


@pytest.mark.parametrize(
    ("sets", "api_versions", "said"),
    [([], [], True), ([], [VAP], False), (["nodeRestrictionPolicy=false"], [], False)],
    ids=["auto-not-served", "auto-served", "off"],
)
def test_a_node_restriction_policy_left_out_by_auto_is_said(
    helm: Helm, sets: list[str], api_versions: list[str], said: bool
) -> None:
    """`helm template` without --api-versions (or an API server without the policy API) leaves
    the policy out: the output says so where it would be, never silently."""
    text = helm.template(sets=sets, api_versions=api_versions).stdout
    assert ("# nodeRestrictionPolicy auto: NOT rendered" in text) == said


@pytest.mark.parametrize(
    ("sets", "api_versions", "rendered"),
    [
        ([], [VAP], True),
        ([], [], False),  # an API server without the policy API (or `helm template` alone)
        (["nodeRestrictionPolicy=false"], [VAP], False),
        (["nodeRestrictionPolicy=true"], [], True),
        (["global.resourceScope=namespace"], [VAP], False),
    ],
    ids=["auto-served", "auto-not-served", "off", "forced", "namespace-scope"],
)
def test_node_restriction_policy_where_the_api_server_serves_it(
    helm: Helm, sets: list[str], api_versions: list[str], rendered: bool
) -> None:
    docs = helm.render(sets=sets, api_versions=api_versions)
    policies = of_kind(docs, "ValidatingAdmissionPolicy")
    bindings = of_kind(docs, "ValidatingAdmissionPolicyBinding")
    assert len(policies) == len(bindings) == (1 if rendered else 0)
    if not rendered:
        return
    (policy,), (binding,) = policies, bindings
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    sa = only(docs, "ServiceAccount")["metadata"]["name"]
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:kube-system:{sa}"'
    )
    assert policy["spec"]["failurePolicy"] == "Fail"
    # It covers every mutating right the ClusterRole can grant.
    role = only(
        helm.render(sets=[*sets, "repair.mode=delete", "removeNotReadyTaint=true"]), "ClusterRole"
    )
    writable = {(r, v) for _, r, v in grants(role["rules"]) if v not in ("get", "list", "watch")}
    covered = {
        (r, op)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for r in rule["resources"]
        for op in rule["operations"]
    }
    verb_op = {"delete": "DELETE", "patch": "UPDATE", "create": "CREATE"}
    assert {(r, verb_op[v]) for r, v in writable} <= covered
