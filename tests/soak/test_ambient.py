"""The soak's ambient check without a node (bench/soak/ambient.py): how an ambient churn pod's
first connections and its enrolment decide whether it ran captured, and when it is too early
to tell; and the churn asking again for a pod it cannot judge yet (testbed/churn.py)."""

from __future__ import annotations

import types
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench.soak.ambient import FIRST_CONNECT_S, NodeZtunnel, captured_line, verdict
from testbed.churn import Churn, ChurnPod

ANSWERED = "connect 203.0.113.10:80 ztunnel-double|uid-1|15001"
REFUSED = "connect 203.0.113.10:80 error: [Errno 111] Connection refused"
UNREACHABLE = "connect 203.0.113.10:80 error: [Errno 113] No route to host"
TIMED_OUT = "connect 203.0.113.10:80 error: timed out"
ENROLLED: dict[str, Any] = {"annotation": "enabled", "rules": True, "added": True}


def test_a_connection_answered_by_the_stand_in_or_refused_in_the_pod_is_captured() -> None:
    assert captured_line(ANSWERED) and captured_line(REFUSED)
    for line in (UNREACHABLE, TIMED_OUT, "app started", "ztunnel-double|uid-1|15001"):
        assert not captured_line(line), line


def test_an_enrolled_pod_whose_connections_stayed_in_it_ran_captured() -> None:
    assert verdict([REFUSED, ANSWERED, ANSWERED], waited=0.5, **ENROLLED) is True


@pytest.mark.parametrize("escaped", [UNREACHABLE, TIMED_OUT])
def test_one_connection_out_of_the_pod_is_uncaptured_at_once_whatever_follows(
    escaped: str,
) -> None:
    assert verdict([escaped, ANSWERED], waited=0.1, **ENROLLED) is False
    assert verdict([ANSWERED, escaped], waited=0.1, **ENROLLED) is False


@pytest.mark.parametrize(
    "missing", [{"annotation": None}, {"annotation": "pending"}, {"rules": False}, {"added": False}]
)
def test_a_pod_not_enrolled_is_awaited_then_uncaptured(missing: dict[str, Any]) -> None:
    state = {**ENROLLED, **missing}
    assert verdict([ANSWERED], waited=1.0, **state) is None
    assert verdict([ANSWERED], waited=FIRST_CONNECT_S, **state) is False


def test_without_a_connection_logged_the_pod_is_awaited_then_judged_on_its_enrolment() -> None:
    assert verdict(["app started"], waited=1.0, **ENROLLED) is None
    assert verdict([], waited=FIRST_CONNECT_S, **ENROLLED) is True
    assert verdict([], waited=FIRST_CONNECT_S, **{**ENROLLED, "rules": False}) is False


class FakeCore:
    """The API calls the churn's checker makes (a list of pods, a delete)."""

    def __init__(self, *pods: Any) -> None:
        self.pods = list(pods)
        self.deleted: list[str] = []

    def list_namespaced_pod(self, namespace: str) -> Any:
        return types.SimpleNamespace(items=self.pods)

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self.deleted.append(name)


CREATED = datetime(2026, 12, 7, 10, 0, 0, tzinfo=UTC)


def running_pod(name: str) -> Any:
    """The fields of the API's pod the churn reads, as the client's models hold them."""
    scheduled = types.SimpleNamespace(
        type="PodScheduled", status="True", last_transition_time=CREATED + timedelta(seconds=1)
    )
    return types.SimpleNamespace(
        metadata=types.SimpleNamespace(name=name, uid=f"uid-{name}", creation_timestamp=CREATED),
        status=types.SimpleNamespace(phase="Running", conditions=[scheduled]),
        spec=types.SimpleNamespace(node_name="tb-node-1"),
    )


def test_the_churn_keeps_a_pod_it_cannot_judge_yet_and_deletes_it_once_judged() -> None:
    answers: list[bool | None] = [None, None, True]
    core = FakeCore(running_pod("ambient-0"))
    nowhere = types.SimpleNamespace(pod_netns=lambda uid: "")  # the check reads no netns
    churn = Churn(core, nowhere, "ns", "image", captured=lambda item: answers.pop(0))
    pod = ChurnPod("ambient-0", created=1.0)
    churn._by_name[pod.name] = pod
    churn._check_once()
    assert pod.running is not None and pod.captured is None and pod.node == "tb-node-1"
    assert pod.phases == {"scheduled": 1.0}
    first_seen = pod.running
    assert not churn._all_ran() and core.deleted == []
    churn._check_once()
    churn._check_once()
    assert pod.running == first_seen and pod.captured is True
    assert core.deleted == ["ambient-0"] and churn._all_ran()
    churn._check_once()  # judged: not asked again
    assert answers == []


def test_the_stand_in_reports_every_violation_but_a_keep_of_a_pod_it_does_not_hold(
    tmp_path: Any,
) -> None:
    standin = NodeZtunnel("tb-node-1", tmp_path / "ztunnel.sock", core=None)
    keep = "KeepWorkload 59f1-uid: a pod this ztunnel does not hold"
    other = "KeepWorkload 59f1-uid: outside a snapshot"
    standin.double.checks.violations += [keep, other]
    assert standin.violations == [other]
    assert standin.tolerated == [keep]
    standin.close()  # never started: nothing to join, no violation raised
