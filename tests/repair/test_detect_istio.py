"""validation_failed against Istio's repair filter (cni/pkg/repair matchesFilter) with its
defaults: sidecar.istio.io/status present, init container istio-validation, exit code 126, no
termination-message filter."""

from __future__ import annotations

from typing import Any

import pytest

from agent.repair.detect import validation_failed


def broken_pod(status: dict[str, Any], annotations: dict[str, str] | None = None) -> Any:
    notes = {"sidecar.istio.io/status": "{}"} if annotations is None else annotations
    return {"metadata": {"annotations": notes}, "status": {"initContainerStatuses": [status]}}


LAST_126 = {"terminated": {"exitCode": 126, "reason": "Error", "message": "no redirect"}}


@pytest.mark.parametrize(
    ("status", "broken"),
    [
        ({"name": "istio-validation", "state": {"running": {}}, "lastState": LAST_126}, True),
        (
            {
                "name": "istio-validation",
                "state": {"terminated": {"exitCode": 126, "reason": "Error"}},
                "lastState": LAST_126,
            },
            True,
        ),
        (
            {
                "name": "istio-validation",
                "state": {"terminated": {"exitCode": 1, "reason": "Completed"}},
                "lastState": LAST_126,
            },
            False,
        ),
        (
            {
                "name": "istio-validation",
                "state": {"terminated": {"exitCode": 0, "reason": "Error"}},
                "lastState": LAST_126,
            },
            False,
        ),
        ({"name": "istio-validation", "state": {}, "lastState": {}}, False),
    ],
    ids=[
        "running-after-126",
        "terminated-126-again",
        "completed-reason",
        "exit-0",
        "never-terminated",
    ],
)
def test_istio_filter(status: dict[str, Any], broken: bool) -> None:
    assert validation_failed(broken_pod(status), init_container_name="istio-validation") is broken


def test_status_annotation_value_is_not_read() -> None:
    status = {"name": "istio-validation", "state": {}, "lastState": LAST_126}
    pod = broken_pod(status, {"sidecar.istio.io/status": ""})
    assert validation_failed(pod, init_container_name="istio-validation") is True
