"""AmbientWatch (live enrollment) over named fakes: which mesh call each pod and namespace event
leads to, the retry of failures, and no retry of Istio's non-retryable adds."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from agent.ambient.enrollment import RedirectionState
from agent.ambient.watch import AmbientWatch, Event
from agent.errors import NonRetryableAdd
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from testbed.wait import wait_for
from tests.ambient.fakes import namespace, pod

AMBIENT = {"istio.io/dataplane-mode": "ambient"}
ENABLED = {"ambient.istio.io/redirection": "enabled"}


class FakeStore:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}

    def cached(self, ns: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((ns, name))

    def list_pods(self) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def cached_namespace(self, name: str) -> dict[str, Any] | None:
        return self.namespaces.get(name)

    def put(self, p: dict[str, Any]) -> dict[str, Any]:
        self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        return p


class FakeMesh:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failures = 0
        self.non_retryable = False
        self.enrolled: set[str] = set()
        """uids the mesh holds as enrolled: its own record, what the watch decides by."""
        self.forgotten: list[str] = []

    def state(self, uid: str) -> RedirectionState:
        return "enabled" if uid in self.enrolled else "none"

    def add(self, p: Any, *, unless_enabled: bool = False) -> object:
        assert unless_enabled, "the watch decides on a state read before the pod's lock"
        self.calls.append(("add", p["metadata"]["name"]))
        if self.non_retryable:
            raise NonRetryableAdd("no netns")
        if self.failures:
            self.failures -= 1
            raise RuntimeError("ztunnel away")
        return None

    def remove(self, p: Any, *, deleted: bool) -> None:
        self.calls.append(("remove-deleted" if deleted else "remove", p["metadata"]["name"]))

    def sync_host_probe(self, p: Any) -> None:
        self.calls.append(("sync", p["metadata"]["name"]))

    def annotate_as_recorded(self, p: Any) -> None:
        self.calls.append(("annotate", p["metadata"]["name"]))

    def forget(self, uid: str) -> None:
        self.forgotten.append(uid)


def make(store: FakeStore, mesh: FakeMesh, events: list[str] | None = None) -> AmbientWatch:
    return AmbientWatch(
        pods=store,
        namespaces=store,
        mesh=mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=["kube-system"],
        system_namespace="istio-system",
        on_event=(events.append if events is not None else None),
    )


def test_namespace_label_enrolls_its_running_pods() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    store.put(pod())
    store.put(pod("other", namespace="elsewhere", uid="uid-9"))
    watch = make(store, mesh)
    watch.handle(Event("namespace", "update", namespace(), namespace(labels=AMBIENT)))
    assert watch.pending() == 1  # the namespace's pod, as an update
    _drain(watch)
    assert mesh.calls == [("add", "web-0")]


def test_namespace_update_without_selector_change_does_nothing() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.put(pod())
    watch = make(store, mesh)
    watch.handle(
        Event("namespace", "update", namespace(labels={"a": "1"}), namespace(labels={"a": "2"}))
    )
    assert watch.pending() == 0


def test_label_removed_releases_and_opt_out_releases() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")  # enrolled by the agent: its record, not the annotation
    store.namespaces["app"] = namespace()
    enrolled = store.put(pod(annotations=ENABLED))
    watch = make(store, mesh)
    watch.handle(Event("pod", "update", enrolled, enrolled))
    store.namespaces["app"] = namespace(labels=AMBIENT)
    opted_out = store.put(pod(annotations=ENABLED, labels={"istio.io/dataplane-mode": "none"}))
    watch.handle(Event("pod", "update", enrolled, opted_out))
    assert mesh.calls == [("remove", "web-0"), ("remove", "web-0")]


def test_deleted_pod_is_released_from_the_event_even_without_namespace() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")  # enrolled by the agent: its record, not the annotation
    watch = make(store, mesh)
    watch.handle(Event("pod", "delete", pod(annotations=ENABLED), None))
    watch.handle(Event("pod", "delete", pod("plain", uid="u2"), None))
    assert mesh.calls == [("remove-deleted", "web-0")]


def test_terminated_enrolled_pod_is_released_as_deleted() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")  # enrolled by the agent: its record, not the annotation
    store.namespaces["app"] = namespace(labels=AMBIENT)
    old = pod(annotations=ENABLED)
    store.put(pod(annotations=ENABLED, phase="Succeeded"))
    make(store, mesh).handle(Event("pod", "update", old, old))
    assert mesh.calls == [("remove-deleted", "web-0")]


def test_new_ips_of_enrolled_pod_sync_the_host_probe_set() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")  # enrolled by the agent: its record, not the annotation
    store.namespaces["app"] = namespace(labels=AMBIENT)
    old = pod(annotations=ENABLED, ips=("10.0.0.5",))
    store.put(pod(annotations=ENABLED, ips=("10.0.0.8",)))
    make(store, mesh).handle(Event("pod", "update", old, old))
    assert mesh.calls == [("sync", "web-0")]


def test_pod_adds_are_ignored_and_events_counted() -> None:
    store, mesh, events = FakeStore(), FakeMesh(), list[str]()
    watch = make(store, mesh, events)
    watch.on_pod("add", None, pod())
    assert watch.pending() == 0
    store.namespaces["app"] = namespace(labels=AMBIENT)
    store.put(pod())
    watch.on_namespace("add", None, namespace(labels=AMBIENT))
    _drain(watch)
    assert events == ["add", "update"] and mesh.calls == [("add", "web-0")]


def test_failed_add_is_retried_until_it_works() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = store.put(pod())
    mesh.failures = 3
    watch = make(store, mesh)
    watch.start()
    try:
        watch.on_pod("update", p, p)
        wait_for(lambda: watch.processed >= 1, "the add to succeed", 5, interval=0.01)
    finally:
        watch.stop()
    assert mesh.calls == [("add", "web-0")] * 4 and watch.processed == 1


def test_non_retryable_add_is_not_retried() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = store.put(pod())
    mesh.non_retryable = True
    watch = make(store, mesh)
    watch.handle(Event("pod", "update", p, p))  # does not raise
    assert watch.pending() == 0


def test_excluded_namespace_and_ztunnel_pods_are_never_enrolled() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["kube-system"] = namespace("kube-system", labels=AMBIENT)
    store.namespaces["istio-system"] = namespace("istio-system", labels=AMBIENT)
    a = store.put(pod("dns", namespace="kube-system", uid="u1"))
    z = store.put(pod("zt", namespace="istio-system", uid="u2", labels={"app": "ztunnel"}))
    watch = make(store, mesh)
    watch.handle(Event("pod", "update", a, a))
    watch.handle(Event("pod", "update", z, z))
    assert mesh.calls == []


@pytest.mark.hostile
def test_a_pod_claiming_to_be_enrolled_is_enrolled_and_one_claiming_not_released() -> None:
    """The annotation is the pod owner's to write: the watch goes by the agent's record."""
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    claims = store.put(pod(annotations=ENABLED))
    make(store, mesh).handle(Event("pod", "update", claims, claims))
    assert mesh.calls == [("add", "web-0")]
    store.namespaces["app"] = namespace()
    mesh.enrolled.add("uid-1")
    hides = store.put(pod(annotations={"ambient.istio.io/redirection": "disabled"}))
    make(store, mesh).handle(Event("pod", "update", hides, hides))
    assert mesh.calls[-1] == ("remove", "web-0")


def test_updates_of_one_pod_merge_into_one_pending_item() -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = store.put(pod())
    watch = make(store, mesh)
    for _ in range(200):
        watch.on_pod("update", p, p)
    watch.on_pod("update", pod("web-1", uid="uid-2"), pod("web-1", uid="uid-2"))
    assert watch.pending() == 2  # one item per pod
    _drain(watch)
    assert mesh.calls == [("add", "web-0")]  # web-1 is not in the cache: nothing to do


def test_a_failing_pod_updated_without_end_is_tried_at_its_back_off_pace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ztunnel away: one pod's add fails for as long as the test runs while the pod is updated
    every few milliseconds; its tries follow the back-off (5 ms doubling), one warning."""
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = store.put(pod())
    mesh.failures = 10**9
    watch = make(store, mesh)
    with caplog.at_level(logging.DEBUG, logger="agent.ambient"):
        for _ in range(200):
            watch.on_pod("update", p, p)
        watch.start()
        try:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                watch.on_pod("update", p, p)
                time.sleep(0.005)
        finally:
            watch.stop()
    # 0, 5, 15, 35, 75, 155, 315, 635 ms: 8 tries in the second (2,000 a second when each update
    # was an item of its own, retried on its own)
    assert 2 <= len(mesh.calls) <= 12, len(mesh.calls)
    assert watch.pending() == 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "retrying" in warnings[0].getMessage()


def test_a_delete_ends_the_pending_updates_of_its_pod_at_once() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = pod(annotations=ENABLED)
    watch = make(store, mesh)
    watch.on_pod("update", p, p)
    watch.on_pod("delete", p, None)
    assert watch.pending() == 1
    _drain(watch)
    assert mesh.calls == [("remove-deleted", "web-0")]


def test_merged_updates_keep_the_first_old_pod_so_a_new_ip_is_seen() -> None:
    store, mesh = FakeStore(), FakeMesh()
    mesh.enrolled.add("uid-1")
    store.namespaces["app"] = namespace(labels=AMBIENT)
    before, after = pod(ips=("10.0.0.5",)), pod(ips=("10.0.0.8",))
    store.put(after)
    watch = make(store, mesh)
    watch.on_pod("update", before, after)
    watch.on_pod("update", after, after)  # e.g. a namespace change re-examining its pods
    _drain(watch)
    assert mesh.calls == [("sync", "web-0")]


def test_a_pod_the_mesh_will_not_capture_is_logged_once_per_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, mesh = FakeStore(), FakeMesh()
    store.namespaces["app"] = namespace(labels=AMBIENT)
    p = store.put(pod())
    mesh.non_retryable = True
    watch = make(store, mesh)
    with caplog.at_level(logging.ERROR, logger="agent.ambient"):
        for _ in range(5):
            watch.handle(Event("pod", "update", p, p))
    assert len(mesh.calls) == 5
    assert len([r for r in caplog.records if "will not retry" in r.getMessage()]) == 1


def _drain(watch: AmbientWatch) -> None:
    while watch.pending():
        taken = watch.next_item(0.01)  # the worker's own steps, driven here
        if taken is not None:
            watch.step(taken)
