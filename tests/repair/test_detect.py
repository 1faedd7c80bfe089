from __future__ import annotations

from typing import Any

import pytest

from agent.repair.detect import is_running_with_addresses, pod_ips, validation_failed


def pod(
    *,
    annotated: bool = True,
    statuses: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    ips: list[str] | None = None,
) -> dict[str, Any]:
    annotations = {"sidecar.istio.io/status": "{}"} if annotated else {}
    status: dict[str, Any] = {"phase": phase, "initContainerStatuses": statuses or []}
    if ips is not None:
        status["podIPs"] = [{"ip": ip} for ip in ips]
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations},
        "status": status,
    }


def init(
    name: str = "istio-validation",
    *,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {"name": name, "state": state or {}, "lastState": last or {}}


FAILED = {"terminated": {"exitCode": 126, "reason": "Error"}}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            pod(statuses=[init(last=FAILED, state={"waiting": {"reason": "CrashLoopBackOff"}})]),
            True,
        ),
        (pod(statuses=[init(last=FAILED)]), True),
        (pod(annotated=False, statuses=[init(last=FAILED)]), False),
        (pod(statuses=[init(last={"terminated": {"exitCode": 1}})]), False),
        (
            pod(
                statuses=[
                    init(last=FAILED, state={"terminated": {"exitCode": 0, "reason": "Completed"}})
                ]
            ),
            False,
        ),
        (pod(statuses=[init("other-init", last=FAILED)]), False),
        (pod(statuses=[]), False),
    ],
    ids=[
        "crashloop",
        "last-failed",
        "no-sidecar",
        "other-exit-code",
        "now-succeeded",
        "other-container",
        "no-init-status",
    ],
)
def test_validation_failed(case: dict[str, Any], expected: bool) -> None:
    assert validation_failed(case, init_container_name="istio-validation") is expected


def test_addresses_from_pod_ips_or_pod_ip() -> None:
    assert pod_ips(pod(ips=["10.0.0.1", "fd00::1"])) == ["10.0.0.1", "fd00::1"]
    legacy = pod()
    legacy["status"]["podIP"] = "10.0.0.2"
    assert pod_ips(legacy) == ["10.0.0.2"]
    assert is_running_with_addresses(pod(ips=["10.0.0.1"]))
    assert not is_running_with_addresses(pod(ips=[]))
    assert not is_running_with_addresses(pod(ips=["10.0.0.1"], phase="Succeeded"))
