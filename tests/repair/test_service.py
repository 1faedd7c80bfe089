"""The repair loop's decisions per round, driven with `run_once`. The API and the netns side are
test doubles (named so): the end-to-end tests in tests/e2e/test_repair.py run the real ones."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agent.config import RepairMode, RepairSettings, Settings
from agent.pods import states as pod_states
from agent.repair.service import RepairService
from agent.rules.sidecar import pod as pod_rules

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
    should_redirect: Callable[[Mapping[str, Any]], bool] = lambda pod: True,
    states: pod_states.PodStates | None = None,
    clock: Callable[[], float] = time.monotonic,
    redirect: Callable[[Mapping[str, Any], str], object] = lambda pod, path: "iptables-nft",
) -> RepairService:
    """`netns`: uid -> path the (test double) finder finds, none by default; `rules`: what the
    found netns holds: exact (today's rendering), differ (ours, otherwise) or absent (none)."""
    settings = Settings(repair=repair or RepairSettings(mode=mode))
    return RepairService(
        settings=settings,
        node_name="node-1",
        pods=pods,
        core=core,
        should_redirect=should_redirect,
        states=states,
        redirect=redirect,
        clock=clock,
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


def sidecar_pod(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """The pod with an injected istio-proxy container and these annotations added."""
    pod["spec"] = {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}
    pod["metadata"]["annotations"].update(annotations)
    return pod


def plugin_decides(pod: Mapping[str, Any]) -> bool:
    """The plugin's own decision (the agent's should_redirect), refusals and all."""
    return pod_rules.decide(pod, exclude_namespaces=()).redirect


def refused_total() -> float:
    labels = {"type": "delete", "result": "refused"}
    return REGISTRY.get_sample_value("istio_cni_repair_pods_repaired_total", labels) or 0.0


def test_a_refused_annotation_is_reported_once_and_the_other_pods_are_repaired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An annotation set after start to a value the ADD refuses: that pod is reported, never
    acted on, and a broken pod beside it is still repaired, round after round."""
    refused = sidecar_pod(running_pod("bad"), **{"sidecar.istio.io/inject": "no thanks"})
    broken = sidecar_pod(broken_pod("u1"))
    core, states, before = FakeCore(), pod_states.PodStates(), refused_total()
    pods = FakePods([refused, broken])
    repair = service(
        pods, core, mode="delete", should_redirect=plugin_decides, states=states, rules="exact"
    )
    with caplog.at_level(logging.DEBUG, logger="agent.repair"):
        rounds = [repair.run_once() for _ in range(4)]
    assert [(o.pod, o.result) for o in rounds[0]] == [
        ("ns/run-bad", "refused"),
        ("ns/p", "success"),
    ]
    assert [(o.pod, o.result) for o in rounds[3]] == [("ns/run-bad", "refused")]
    assert [name for _, name, _ in core.deleted] == ["p"]  # the broken pod, not the refused one
    assert [e["reason"] for e in core.events] == ["RedirectRefused", "DeleteBrokenPod"]
    assert "sidecar.istio.io/inject" in core.events[0]["message"]
    assert "no thanks" in core.events[0]["message"]
    assert refused_total() == before + 1
    warnings = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)
    record = states.get("bad")
    assert record is not None
    noted = record.outcomes[pod_states.REPAIR]
    assert noted.state == pod_states.REFUSED
    assert "sidecar.istio.io/inject" in noted.reason and "no thanks" in noted.reason


def test_a_broken_pod_whose_capture_annotation_is_refused_is_not_deleted() -> None:
    """The ADD reads the capture annotations too: repair agrees with it and leaves the pod."""
    pod = sidecar_pod(
        broken_pod(), **{"traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8, all"}
    )
    core = FakeCore()
    repair = service(FakePods([pod]), core, mode="delete", should_redirect=plugin_decides)
    assert [o.result for o in repair.run_once()] == ["refused"]
    assert core.deleted == []
    assert "includeOutboundIPRanges" in core.events[0]["message"]


def test_a_corrected_annotation_lets_the_pod_be_handled() -> None:
    pod = sidecar_pod(broken_pod(), **{"sidecar.istio.io/inject": "no thanks"})
    core = FakeCore()
    repair = service(FakePods([pod]), core, mode="delete", should_redirect=plugin_decides)
    assert [o.result for o in repair.run_once()] == ["refused"]
    pod["metadata"]["annotations"]["sidecar.istio.io/inject"] = "true"
    assert [o.result for o in repair.run_once()] == ["success"]
    assert [name for _, name, _ in core.deleted] == ["p"]


def test_a_pod_failing_unexpectedly_ends_only_its_own_handling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def should_redirect(pod: Mapping[str, Any]) -> bool:
        if pod["metadata"]["uid"] == "odd":
            raise TypeError("a value of an unexpected type")
        return True

    core = FakeCore()
    pods = FakePods([broken_pod("odd"), broken_pod("u1")])
    repair = service(pods, core, mode="delete", should_redirect=should_redirect)
    with caplog.at_level(logging.ERROR, logger="agent.repair"):
        first = repair.run_once()
        again = [repair.run_once() for _ in range(3)]
    assert [(o.action, o.result) for o in first] == [("none", "fail"), ("delete", "success")]
    assert all([o.result for o in r] == ["fail"] for r in again)
    assert len(core.deleted) == 1
    assert len([r for r in caplog.records if r.exc_info]) == 1  # one traceback, not one a round


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def repair_duration(kind: str) -> tuple[float, float]:
    """(count, sum) of istio_cni_repair_duration_seconds{type=kind} so far."""
    labels = {"type": kind}
    count = REGISTRY.get_sample_value("istio_cni_repair_duration_seconds_count", labels) or 0.0
    total = REGISTRY.get_sample_value("istio_cni_repair_duration_seconds_sum", labels) or 0.0
    return count, total


def test_repair_duration_runs_from_the_round_that_found_the_pod_to_its_repair() -> None:
    """Rounds that failed to repair it count: the pod ran without redirect all that time."""
    clock = Clock()
    netns: dict[str, str] = {}

    def redirect(pod: Mapping[str, Any], path: str) -> str:
        clock.now += 0.25  # programming the rules takes a while
        return "iptables-nft"

    repair = service(
        FakePods([broken_pod()]), FakeCore(), netns=netns, clock=clock, redirect=redirect
    )
    before = repair_duration("repair")
    assert repair.run_once()[0].result == "fail"  # at 1000: no netns found yet
    clock.now += 5
    assert repair.run_once()[0].result == "fail"
    clock.now += 5
    netns["u1"] = "/var/run/netns/p"
    assert repair.run_once()[0].result == "success"  # at 1010, done at 1010.25
    count, total = repair_duration("repair")
    assert count - before[0] == 1
    assert total - before[1] == pytest.approx(10.25)
    assert repair.run_once() == []  # handled: not timed again
    assert repair_duration("repair")[0] == count


def test_a_pod_gone_before_its_repair_is_not_timed() -> None:
    clock = Clock()
    pods = FakePods([broken_pod("u9")])
    repair = service(pods, FakeCore(), clock=clock)
    before = repair_duration("repair")
    repair.run_once()  # fails: no netns
    pods.pods = []
    clock.now += 60
    repair.run_once()
    pods.pods = [broken_pod("u9")]  # the same uid again: timed from when it is seen again
    clock.now += 60
    repair.run_once()
    assert repair._broken_since == {"u9": clock.now}
    assert repair_duration("repair") == before
