"""The repair loop's decisions per round, driven with `run_once`. The API and the netns side are
test doubles (named so): the end-to-end tests in tests/e2e/test_repair.py run the real ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    pods: FakePods, core: FakeCore, *, mode: RepairMode = "repair-in-place"
) -> RepairService:
    """No netns is found (empty dirs): repair in place cannot succeed."""
    settings = Settings(
        repair=RepairSettings(mode=mode), mountedNetnsDir="/nonexistent", hostProcDir="/nonexistent"
    )
    return RepairService(
        settings=settings,
        node_name="node-1",
        pods=pods,
        core=core,
        should_redirect=lambda pod: True,
        redirect=lambda pod, path: "iptables-nft",
        rules_in_place=lambda pod, path: False,
        read_addresses=lambda path: set(),
    )


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
