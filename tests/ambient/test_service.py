"""AmbientService's start-up over named fakes: one pod that cannot be judged or reconciled leaves
the other pods' start-up, ztunnel's server and the watch alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.ambient.mesh import MeshDataplane, rule_options_for
from agent.ambient.service import AmbientService
from agent.ambient.watch import AmbientWatch
from agent.config import AmbientSettings
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from agent.rules.ambient.options import PodRuleOptions
from testbed.wait import wait_for
from tests.ambient.fakes import (
    FakeAnnotator,
    FakeHostProbeRules,
    FakeNetnsFinder,
    FakePodRules,
    FakeZtunnelLink,
    Journal,
    namespace,
    pod,
)

AMBIENT = {"istio.io/dataplane-mode": "ambient"}


class FakeCache:
    """The pod and namespace caches in one: synced from the start, listeners kept."""

    def __init__(self, pods: list[dict[str, Any]], namespaces: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.namespaces = {n["metadata"]["name"]: n for n in namespaces}
        self.listeners: list[Callable[..., None]] = []

    def add_listener(self, listener: Callable[..., None]) -> None:
        self.listeners.append(listener)

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def ready(self) -> bool:
        return True

    def list_pods(self) -> list[dict[str, Any]]:
        return self.pods

    def cached(self, ns: str, name: str) -> dict[str, Any] | None:
        return None

    def cached_namespace(self, name: str) -> dict[str, Any] | None:
        if name == "broken":
            raise RuntimeError("namespace cache failed for this one")
        return self.namespaces.get(name)


def test_start_up_goes_on_past_pods_that_cannot_be_judged_or_reconciled(tmp_path: Path) -> None:
    journal: Journal = []
    rules, host, ztunnel = (
        FakePodRules(journal),
        FakeHostProbeRules(journal),
        FakeZtunnelLink(journal),
    )
    finder = FakeNetnsFinder(journal)
    malformed = pod("odd", uid="uid-0")
    malformed["metadata"]["labels"] = AMBIENT
    malformed["status"]["podIPs"] = 5  # not a list: reconciling it raises
    unjudged = pod("odd", namespace="broken", uid="uid-3")  # judging it raises
    refused = pod(
        uid="uid-1", annotations={"ambient.istio.io/bypass-inbound-capture": "yes please"}
    )
    good = pod("web-1", uid="uid-2", ips=("10.0.0.6",))
    for uid in ("uid-0", "uid-1", "uid-2", "uid-3"):
        netns = tmp_path / uid
        netns.touch()
        finder.by_uid[uid] = str(netns)
        rules.programmed[str(netns)] = PodRuleOptions(ingress=uid == "uid-1")
    cache = FakeCache([malformed, unjudged, refused, good], [namespace(labels=AMBIENT)])
    mesh = MeshDataplane(
        pod_rules=rules,
        host_rules=host,
        ztunnel=ztunnel,
        annotator=FakeAnnotator(journal),
        find_netns=finder,
        options_for=rule_options_for(PodRuleOptions()),
    )
    settings = AmbientSettings(enabled=True, reconcileIptablesOnStartup=True)
    watch = AmbientWatch(
        pods=cache,
        namespaces=cache,
        mesh=mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=(),
        system_namespace="istio-system",
    )
    service = AmbientService(
        settings=settings, pods=cache, namespaces=cache, mesh=mesh, ztunnel=ztunnel, watch=watch
    )
    service.start()
    try:
        wait_for(service.ready, "ambient start-up done", 5, interval=0.01)
    finally:
        service.stop()
    report = service.reconciled
    assert report is not None
    # a pod that could not be judged is reconciled (fail closed: its netns holds our rules)
    assert report.found == ["uid-3", "uid-1", "uid-2"] and report.failed == ["uid-0"]
    assert {p.uid for p in mesh.snapshot()} == {"uid-1", "uid-2", "uid-3"}
    assert set(host.entries) == {"uid-1", "uid-2", "uid-3"}
    assert rules.programmed[str(tmp_path / "uid-1")] == PodRuleOptions()  # inbound captured


class ServingCache(FakeCache):
    def cached(self, ns: str, name: str) -> dict[str, Any] | None:
        return next(
            (
                p
                for p in self.pods
                if p["metadata"]["name"] == name and p["metadata"]["namespace"] == ns
            ),
            None,
        )


def test_start_up_makes_the_annotation_match_what_the_node_shows(tmp_path: Path) -> None:
    """A pod found enrolled (its netns holds our rules) without `enabled`, written while it was
    pending or removed by hand, gets it; a pod claiming `enabled` that is not enrolled and is
    not to be loses the claim. istiod reads this annotation to send the pod HBONE."""
    journal: Journal = []
    rules, finder = FakePodRules(journal), FakeNetnsFinder(journal)
    annotator = FakeAnnotator(journal)
    netns = tmp_path / "uid-1"
    netns.touch()
    finder.by_uid["uid-1"] = str(netns)
    rules.programmed[str(netns)] = PodRuleOptions()
    found = pod(uid="uid-1", annotations={"ambient.istio.io/redirection": "pending"})
    claim = pod(
        "db-0",
        namespace="plain",
        uid="uid-2",
        annotations={"ambient.istio.io/redirection": "enabled"},
    )
    cache = ServingCache([found, claim], [namespace(labels=AMBIENT), namespace("plain")])
    mesh = MeshDataplane(
        pod_rules=rules,
        host_rules=FakeHostProbeRules(journal),
        ztunnel=FakeZtunnelLink(journal),
        annotator=annotator,
        find_netns=finder,
        options_for=rule_options_for(PodRuleOptions()),
    )
    watch = AmbientWatch(
        pods=cache,
        namespaces=cache,
        mesh=mesh,
        selectors=DEFAULT_ENABLEMENT_SELECTORS,
        exclude_namespaces=(),
        system_namespace="istio-system",
    )
    service = AmbientService(
        settings=AmbientSettings(enabled=True),
        pods=cache,
        namespaces=cache,
        mesh=mesh,
        ztunnel=FakeZtunnelLink(journal),
        watch=watch,
    )
    service.start()
    try:
        wait_for(service.ready, "ambient start-up done", 5, interval=0.01)
        for ns in cache.namespaces.values():  # the namespace cache's first list
            watch.on_namespace("add", None, ns)
        wait_for(lambda: len(annotator.values) == 2, "annotations written", 5, interval=0.01)
    finally:
        service.stop()
    assert annotator.values == {"app/web-0": "enabled", "plain/db-0": None}
