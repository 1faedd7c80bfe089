"""The repair loop's decisions per round, driven with `run_once`. The API and the netns side are
test doubles (named so): the end-to-end tests in tests/e2e/test_repair.py run the real ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.config import RepairMode, RepairSettings, Settings
from agent.repair.service import RepairService

BROKEN_STATUS = {
    "phase": "Pending",
    "podIPs": [{"ip": "10.9.9.9"}],
    "initContainerStatuses": [
        {
            "name": "istio-validation",
            "state": {"waiting": {}},
            "lastState": {"terminated": {"exitCode": 126}},
        }
    ],
}


def broken_pod(uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": "1",
            "annotations": {"sidecar.istio.io/status": "{}"},
        },
        "status": BROKEN_STATUS,
    }


class FakePods:
    """Test double of the pod cache."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    def list_pods(self) -> Sequence[Mapping[str, Any]]:
        return self.pods

    def ready(self) -> bool:
        return True


class FakeCore:
    """Test double of CoreV1Api: records Events, deletes and status patches."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.deleted: list[Any] = []

    def delete_namespaced_pod(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.deleted.append((namespace, name, kwargs.get("body")))

    def patch_namespaced_pod_status(
        self, name: str, namespace: str, body: Any, **kwargs: Any
    ) -> None:
        raise AssertionError("not used here")

    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> None:
        self.events.append(body)


def service(
    pods: FakePods,
    core: FakeCore,
    *,
    mode: RepairMode = "repair-in-place",
    netns: Mapping[str, str] | None = None,
    rules: str = "absent",
    repair: RepairSettings | None = None,
) -> RepairService:
    """`netns`: uid -> path the (test double) finder finds, none by default; `rules`: what the
    found netns holds: exact (today's rendering), differ (ours, otherwise) or absent (none)."""
    settings = Settings(repair=repair or RepairSettings(mode=mode))
    return RepairService(
        settings=settings,
        node_name="node-1",
        pods=pods,
        core=core,
        should_redirect=lambda pod: True,
        redirect=lambda pod, path: "iptables-nft",
        rules_in_place=lambda pod, path: rules == "exact",
        ours_present=lambda path: rules != "absent",
        find_netns=lambda todo: {u: p for u, p in (netns or {}).items()},
    )


def running_pod(uid: str = "r1") -> dict[str, Any]:
    """A meshed pod that started fine: validation passed."""
    pod = broken_pod(uid)
    pod["metadata"]["name"] = f"run-{uid}"
    pod["status"] = {
        "phase": "Running",
        "podIPs": [{"ip": "10.9.9.8"}],
        "initContainerStatuses": [
            {"name": "istio-validation", "state": {"terminated": {"exitCode": 0}}}
        ],
    }
    return pod


def test_a_failing_repair_is_retried_but_reported_once() -> None:
    core = FakeCore()
    repair = service(FakePods([broken_pod()]), core)
    outcomes = [repair.run_once() for _ in range(3)]
    assert [o[0].result for o in outcomes] == ["fail", "fail", "fail"]
    assert len(core.events) == 1
    assert "network namespace not found" in core.events[0]["message"]


def test_a_deleted_and_recreated_pod_is_reported_again() -> None:
    core = FakeCore()
    pods = FakePods([broken_pod("u1")])
    repair = service(pods, core)
    repair.run_once()
    pods.pods = []
    repair.run_once()  # gone: forgotten
    pods.pods = [broken_pod("u1")]
    repair.run_once()
    assert len(core.events) == 2


def test_delete_mode_sends_uid_and_resource_version_preconditions() -> None:
    core = FakeCore()
    repair = service(FakePods([broken_pod()]), core, mode="delete")
    [outcome] = repair.run_once()
    assert (outcome.action, outcome.result) == ("delete", "success")
    [(namespace, name, body)] = core.deleted
    assert (namespace, name) == ("ns", "p")
    assert body["preconditions"] == {"uid": "u1", "resourceVersion": "1"}
    assert repair.run_once() == []  # handled once


def test_rules_that_differ_are_reported_once_and_left_alone_even_in_delete_mode() -> None:
    before = REGISTRY.get_sample_value("istio_cni_repair_rules_differ_total") or 0.0
    core = FakeCore()
    pods = FakePods([running_pod("r1"), running_pod("r2")])
    repair = service(pods, core, mode="delete", netns={"r1": "/n/1", "r2": "/n/2"}, rules="differ")
    outcomes = repair.run_once()
    assert [(o.action, o.result) for o in outcomes] == [("none", "differ")] * 2
    for _ in range(3):
        assert repair.run_once() == []
    assert core.deleted == []
    assert [e["reason"] for e in core.events] == ["RedirectRulesDiffer"] * 2
    assert {e["involvedObject"]["uid"] for e in core.events} == {"r1", "r2"}
    assert REGISTRY.get_sample_value("istio_cni_repair_rules_differ_total") == before + 2


def test_a_namespace_with_none_of_our_rules_is_handled_by_mode() -> None:
    core = FakeCore()
    repair = service(FakePods([running_pod()]), core, mode="delete", netns={"r1": "/n/1"})
    [outcome] = repair.run_once()
    assert (outcome.action, outcome.result) == ("delete", "success")
    assert [e["reason"] for e in core.events] == ["DeleteBrokenPod"]


def test_rules_as_rendered_today_are_left_alone_silently() -> None:
    core = FakeCore()
    repair = service(FakePods([running_pod()]), core, netns={"r1": "/n/1"}, rules="exact")
    [outcome] = repair.run_once()
    assert (outcome.action, outcome.result) == ("none", "skip")
    assert core.events == [] and core.deleted == []


def test_a_pod_whose_netns_is_not_found_is_not_acted_on() -> None:
    """Not found (not there yet, or refused as ambiguous): nothing done, looked at again."""
    core = FakeCore()
    repair = service(FakePods([running_pod()]), core, mode="delete")
    assert [(o.action, o.result) for o in repair.run_once()] == [("none", "skip")]
    assert [(o.action, o.result) for o in repair.run_once()] == [("none", "skip")]
    assert core.deleted == [] and core.events == []


@pytest.mark.parametrize(
    ("exit_code", "message", "configured_code", "configured_message", "broken"),
    [
        (126, "", 126, "", True),
        (1, "", 126, "", False),
        (1, "", 0, "", True),  # 0: any failure
        (126, "no redirect\n", 126, "no redirect", True),
        (126, "other", 126, "no redirect", False),
    ],
    ids=["istio-code", "other-code", "any-code", "message-matches", "message-differs"],
)
def test_validation_failure_by_the_configured_exit_code_and_message(
    exit_code: int, message: str, configured_code: int, configured_message: str, broken: bool
) -> None:
    pod = broken_pod()
    pod["status"] = {
        **BROKEN_STATUS,
        "initContainerStatuses": [
            {
                "name": "istio-validation",
                "state": {"waiting": {}},
                "lastState": {"terminated": {"exitCode": exit_code, "message": message}},
            }
        ],
    }
    core = FakeCore()
    settings = RepairSettings(
        mode="delete",
        initContainerExitCode=configured_code,
        initContainerTerminationMessage=configured_message,
    )
    # Its netns holds rules as rendered: only the validation failure can make it a target.
    repair = service(FakePods([pod]), core, repair=settings, netns={"u1": "/n/1"}, rules="exact")
    repair.run_once()
    assert bool(core.deleted) is broken
