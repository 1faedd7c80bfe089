"""Where a churn pod's start went (testbed/churn.py start_phases): the scheduler's bind and the
sandbox kubelet made, from the conditions the API reports, as seconds after creation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodStatus

from testbed.churn import start_phases

CREATED = datetime(2026, 12, 7, 10, 0, 0, tzinfo=UTC)


def pod(*conditions: tuple[str, str, float]) -> V1Pod:
    return V1Pod(
        metadata=V1ObjectMeta(name="p", creation_timestamp=CREATED),
        status=V1PodStatus(
            conditions=[
                V1PodCondition(
                    type=kind, status=status, last_transition_time=CREATED + timedelta(seconds=s)
                )
                for kind, status, s in conditions
            ]
        ),
    )


def test_the_bind_and_the_sandbox_are_seconds_after_creation() -> None:
    found = start_phases(
        pod(
            ("PodScheduled", "True", 1),
            ("PodReadyToStartContainers", "True", 6),
            ("Ready", "True", 8),  # not a phase of its own: the start's end is Running
        )
    )
    assert found == {"scheduled": 1.0, "sandbox": 6.0}


def test_a_condition_not_true_yet_is_left_out() -> None:
    assert start_phases(
        pod(("PodScheduled", "True", 0), ("PodReadyToStartContainers", "False", 2))
    ) == {"scheduled": 0.0}
    assert (
        start_phases(V1Pod(metadata=V1ObjectMeta(creation_timestamp=CREATED), status=V1PodStatus()))
        == {}
    )
