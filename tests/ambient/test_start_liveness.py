"""Ambient's start-up task under liveness: stuck in one step of its reconcile (here reading one
pod's rules, a netns operation that never returns) past its bound, /healthz fails naming
`ambient-start` until released; waiting for the caches, or busy with many pods each read within
the bound, it stays live. AmbientService and MeshDataplane are real, the node's parts the named
fakes of tests.ambient.fakes; the clock is the test's (tests.liveness_rig)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent.ambient.mesh import MeshDataplane, rule_options_for
from agent.ambient.service import START_HEARTBEAT, AmbientService
from agent.ambient.watch import AmbientWatch
from agent.config import AmbientSettings
from agent.label_selectors import DEFAULT_ENABLEMENT_SELECTORS
from agent.netns import COMMAND_TIMEOUT_SECONDS
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
from tests.ambient.test_service import AMBIENT, FakeCache
from tests.liveness_rig import Probed, hangs_of, probed

LOOP = "ambient-start"
BOUND = 100.0


class HookedPodRules(FakePodRules):
    """Reads a pod's rules after the hook: held until `released` for the netns `hold` (an
    operation that never returns), else the clock moved by `takes` seconds (a slow read)."""

    def __init__(self, journal: Journal, rig: Probed) -> None:
        super().__init__(journal)
        self.rig = rig
        self.hold = ""
        self.takes = 0.0
        self.entered = threading.Event()
        self.released = threading.Event()
        self.seen: list[list[str]] = []

    def installed(self, netns_path: str) -> bool:
        if netns_path == self.hold:
            self.entered.set()
            self.released.wait(30)
        else:
            self.rig.clock.now += self.takes
            self.seen.append(self.rig.failing())
        return super().installed(netns_path)


class SlowCache(FakeCache):
    """Not synced until `synced` is set."""

    def __init__(self, pods: list[dict[str, Any]], namespaces: list[dict[str, Any]]) -> None:
        super().__init__(pods, namespaces)
        self.synced = threading.Event()

    def ready(self) -> bool:
        return self.synced.is_set()


@pytest.fixture
def rig() -> Iterator[Probed]:
    with probed() as rig:
        yield rig


def service_for(
    rig: Probed, rules: HookedPodRules, cache: FakeCache, journal: Journal
) -> AmbientService:
    ztunnel = FakeZtunnelLink(journal)
    mesh = MeshDataplane(
        pod_rules=rules,
        host_rules=FakeHostProbeRules(journal),
        ztunnel=ztunnel,
        annotator=FakeAnnotator(journal),
        find_netns=finder_for(cache, journal),
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
    return AmbientService(
        settings=AmbientSettings(enabled=True),
        pods=cache,
        namespaces=cache,
        mesh=mesh,
        ztunnel=ztunnel,
        watch=watch,
        liveness=rig.liveness,
        heartbeat=BOUND,
    )


def finder_for(cache: FakeCache, journal: Journal) -> FakeNetnsFinder:
    finder = FakeNetnsFinder(journal)
    for p in cache.pods:
        finder.by_uid[p["metadata"]["uid"]] = f"/proc/1/ns/net#{p['metadata']['uid']}"
    return finder


def ambient_pods(count: int) -> list[dict[str, Any]]:
    return [pod(f"web-{i}", uid=f"uid-{i}", ips=(f"10.0.0.{i + 10}",)) for i in range(count)]


def test_the_bound_covers_a_steps_programs() -> None:
    assert START_HEARTBEAT > 8 * COMMAND_TIMEOUT_SECONDS  # a pod's rules read and written


def test_start_up_stuck_in_a_step_fails_healthz_naming_it_until_released(rig: Probed) -> None:
    journal: Journal = []
    rules = HookedPodRules(journal, rig)
    cache = FakeCache(ambient_pods(3), [namespace(labels=AMBIENT)])
    rules.hold = "/proc/1/ns/net#uid-1"
    service = service_for(rig, rules, cache, journal)
    before = hangs_of(LOOP)
    service.start()
    try:
        assert rules.entered.wait(10)
        rig.clock.now += BOUND - 1
        assert rig.healthz() == (200, "ok\n")
        rig.clock.now += 2
        status, text = rig.healthz()
        assert status == 503
        assert text.startswith(f"not live: {LOOP}\n{LOOP}: no turn for 101 s (bound 100 s)")
        assert rig.healthz()[0] == 503
        assert hangs_of(LOOP) == before + 1
        rules.released.set()
        wait_for(service.ready, "ambient start-up done", 10, interval=0.01)
        rig.wait_live("start-up done: no longer judged")
    finally:
        rules.released.set()
        service.stop()


def test_start_up_waiting_for_the_caches_or_busy_with_many_pods_stays_live(rig: Probed) -> None:
    journal: Journal = []
    rules = HookedPodRules(journal, rig)
    rules.takes = 0.6 * BOUND  # each pod's read well within the bound; 5 pods: 3 bounds
    cache = SlowCache(ambient_pods(5), [namespace(labels=AMBIENT)])
    service = service_for(rig, rules, cache, journal)
    service.start()
    try:
        for _ in range(4):  # the caches not synced for 2.4 bounds: waiting is no hang
            rig.clock.now += 0.6 * BOUND
            threading.Event().wait(0.3)  # a few of its waits (0.1 s each)
            assert LOOP not in rig.failing()
        cache.synced.set()
        wait_for(service.ready, "ambient start-up done", 10, interval=0.01)
        assert rules.seen == [[]] * 5
        assert rig.healthz() == (200, "ok\n")
    finally:
        service.stop()
