"""The latency the agent exports per CNI ADD: istio_cni_add_duration_seconds{mode,result} with
closed label sets, the plugin's exec as the runtime sees it (istio_cni_plugin_exec_duration_seconds,
from the start the plugin reports, believed only within bounds), and the recent ADDs that
`istio-cni-agent status` summarises."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.errors import AgentError
from agent.metrics import ADD_BUCKETS, EXEC_BUCKETS, RecentDurations
from agent.podserver.handlers import PodHandlers
from agent.podserver.metrics import ADD_MODES, ADD_RESULTS, MAX_EXEC_SECONDS, PluginMetrics
from agent.podserver.sandboxes import SandboxStore
from tests.podserver.helpers import (
    InMemoryPods,
    ScriptedRedirector,
    StandInDecision,
    cni_body,
    make_pod,
)

NOW = 5000.0
"""The agent's CLOCK_BOOTTIME in these tests."""


class Retryable(AgentError):
    retry_later = True


@dataclass(frozen=True)
class Verdict:
    enroll: bool
    reason: str


class AmbientStandIn:
    """Enrolls every pod named `amb-*`."""

    def decide(self, pod: Mapping[str, Any]) -> Verdict:
        return Verdict(pod["metadata"]["name"].startswith("amb-"), "namespace is ambient")

    def enroll(
        self, pod: Mapping[str, Any], netns: str, *, sandbox: str, ips: tuple[str, ...]
    ) -> str:
        return "enrolled"

    def release(self, pod: Mapping[str, Any], *, sandbox: str) -> None:
        pass


def rig(
    pods: InMemoryPods, redirector: ScriptedRedirector | None = None
) -> tuple[PodHandlers, CollectorRegistry, PluginMetrics]:
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry)
    handlers = PodHandlers(
        pods=pods,
        redirector=redirector or ScriptedRedirector(),
        sandboxes=SandboxStore(),
        readiness=lambda: None,
        metrics=metrics,
        ambient=AmbientStandIn(),
        clock=lambda: NOW,
    )
    return handlers, registry, metrics


def add_count(registry: CollectorRegistry, mode: str, result: str) -> float:
    value = registry.get_sample_value(
        "istio_cni_add_duration_seconds_count", {"mode": mode, "result": result}
    )
    return value or 0.0


def with_start(body: bytes, started: object) -> bytes:
    data = json.loads(body)
    data["startedAt"] = started
    return json.dumps(data).encode()


def exec_count(registry: CollectorRegistry, command: str = "add") -> float:
    value = registry.get_sample_value(
        "istio_cni_plugin_exec_duration_seconds_count", {"command": command}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("seconds", "le_first_counted"),
    [(0.0004, 0.001), (0.02, 0.025), (0.025, 0.025), (0.7, 1.0), (12.0, 30.0), (45.0, None)],
    ids=["sub-ms", "20ms", "on-a-bound", "700ms", "12s", "past-the-last"],
)
def test_an_add_lands_in_the_first_bucket_that_holds_it(
    seconds: float, le_first_counted: float | None
) -> None:
    registry = CollectorRegistry()
    PluginMetrics(registry).add_done("sidecar", 200, seconds)
    labels = {"mode": "sidecar", "result": "ok"}
    for le in ADD_BUCKETS:
        got = registry.get_sample_value(
            "istio_cni_add_duration_seconds_bucket", {**labels, "le": str(le)}
        )
        held = le_first_counted is not None and le >= le_first_counted
        assert got == (1.0 if held else 0.0), le
    inf = {**labels, "le": "+Inf"}
    assert registry.get_sample_value("istio_cni_add_duration_seconds_bucket", inf) == 1.0


def test_exec_buckets_start_past_an_interpreter_start_and_reach_tens_of_seconds() -> None:
    assert EXEC_BUCKETS[0] <= 0.01 and EXEC_BUCKETS[-1] >= 10
    assert list(EXEC_BUCKETS) == sorted(EXEC_BUCKETS)
    assert list(ADD_BUCKETS) == sorted(ADD_BUCKETS)


def test_each_add_is_labelled_by_its_mode_and_result() -> None:
    pods = InMemoryPods(
        make_pod("web-0", uid="u0"),
        make_pod("skip-0", uid="u1"),
        make_pod("amb-0", uid="u2"),
        make_pod("broken-0", uid="u3"),
    )
    redirector = ScriptedRedirector(decisions={"skip-0": StandInDecision(False, "no sidecar")})
    handlers, registry, _ = rig(pods, redirector)
    assert handlers.add(cni_body(pod="web-0")).status == 200
    assert handlers.add(cni_body(pod="skip-0")).status == 200
    assert handlers.add(cni_body(pod="amb-0")).status == 200
    assert handlers.add(cni_body(pod="nobody")).status == 503  # not found: try again later
    redirector.apply_error = RuntimeError("iptables-restore: exit 4")
    assert handlers.add(cni_body(pod="broken-0")).status == 500
    redirector.apply_error = Retryable("backend busy")
    assert handlers.add(cni_body(pod="broken-0")).status == 503
    assert handlers.add(b"not json").status == 400
    assert add_count(registry, "sidecar", "ok") == 1
    assert add_count(registry, "none", "ok") == 1
    assert add_count(registry, "ambient", "ok") == 1
    assert add_count(registry, "undecided", "retry") == 1
    assert add_count(registry, "sidecar", "error") == 1
    assert add_count(registry, "sidecar", "retry") == 1
    assert add_count(registry, "undecided", "error") == 1
    # CHECK and DEL are not ADDs.
    handlers.check(cni_body("CHECK", pod="web-0"))
    handlers.delete(cni_body("DEL", pod="web-0"))
    total = sum(add_count(registry, m, r) for m in ADD_MODES for r in ADD_RESULTS)
    assert total == 7


def test_label_values_stay_in_their_closed_sets_whatever_the_pod() -> None:
    """No label value comes from a request: pod names, namespaces, uids, a hostile mode."""
    handlers, registry, metrics = rig(InMemoryPods(make_pod('x"} 1\nevil{a="', uid="u")))
    handlers.add(cni_body(pod='x"} 1\nevil{a="'))
    handlers.add(cni_body(pod="a" * 300, namespace="ns-" + "b" * 60))
    metrics.add_done('evil"mode', 418, 0.1)
    metrics.exec_done("GC", 0.1)
    for family in registry.collect():
        if family.name not in (
            "istio_cni_add_duration_seconds",
            "istio_cni_plugin_exec_duration_seconds",
        ):
            continue
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            if family.name == "istio_cni_add_duration_seconds":
                assert labels["mode"] in ADD_MODES and labels["result"] in ADD_RESULTS
            else:
                assert labels["command"] in ("add", "check", "del")
    assert add_count(registry, "undecided", "error") == 1  # the hostile mode, as undecided


def test_the_plugin_exec_runs_from_its_reported_start_to_the_answer() -> None:
    handlers, registry, _ = rig(InMemoryPods(make_pod()))
    handlers.add(with_start(cni_body(), NOW - 0.042))
    handlers.delete(with_start(cni_body("DEL"), NOW - 0.003))
    assert exec_count(registry) == 1
    got = registry.get_sample_value(
        "istio_cni_plugin_exec_duration_seconds_sum", {"command": "add"}
    )
    assert got == pytest.approx(0.042)
    le = {"command": "add", "le": "0.05"}
    assert registry.get_sample_value("istio_cni_plugin_exec_duration_seconds_bucket", le) == 1
    le = {"command": "add", "le": "0.025"}
    assert registry.get_sample_value("istio_cni_plugin_exec_duration_seconds_bucket", le) == 0
    assert exec_count(registry, "del") == 1


BAD_STARTS = {
    "a-string": b'"4999.9"',
    "a-boolean": b"true",
    "null": b"null",
    "an-object": b'{"s": 1}',
    "not-a-number": b"NaN",
    "infinite": b"1e400",
    "minus-infinite": b"-1e400",
    "a-huge-integer": b"1" + b"0" * 400,
    "in-the-future": str(NOW + 1).encode(),
    "too-long-ago": str(NOW - MAX_EXEC_SECONDS - 1).encode(),
    "at-boot": b"0",
}


@pytest.mark.parametrize("raw", BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_an_unbelievable_start_is_ignored_and_the_add_served(raw: bytes) -> None:
    handlers, registry, _ = rig(InMemoryPods(make_pod()))
    body = cni_body().replace(b'"prevResult":null', b'"prevResult":null,"startedAt":' + raw)
    assert b"startedAt" in body
    reply = handlers.add(body)
    assert reply.status == 200, reply.body
    assert exec_count(registry) == 0
    assert add_count(registry, "sidecar", "ok") == 1


def test_a_plugin_that_reports_no_start_adds_no_exec() -> None:
    handlers, registry, _ = rig(InMemoryPods(make_pod()))
    assert handlers.add(cni_body()).status == 200
    assert exec_count(registry) == 0


def test_the_longest_believable_exec_is_counted() -> None:
    handlers, registry, _ = rig(InMemoryPods(make_pod()))
    handlers.add(with_start(cni_body(), NOW - MAX_EXEC_SECONDS))
    assert exec_count(registry) == 1


def test_recent_adds_feed_the_status_summary() -> None:
    handlers, _, metrics = rig(InMemoryPods(make_pod()))
    for _ in range(3):
        handlers.add(cni_body())
    summary = metrics.recent_adds.summary()
    assert summary["count"] == 3
    assert summary["p50Seconds"] is not None and summary["p99Seconds"] is not None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_quantiles_by_nearest_rank_from_known_samples() -> None:
    clock = Clock()
    recent = RecentDurations(size=1000, window=300.0, clock=clock)
    for ms in range(1, 101):  # 1 ms .. 100 ms
        recent.add(ms / 1000)
    assert recent.summary() == {
        "windowSeconds": 300.0,
        "count": 100,
        "p50Seconds": 0.050,
        "p99Seconds": 0.099,
    }
    recent.add(5.0)  # one slow ADD among 101: the p99 is the 100th value
    assert recent.summary()["p99Seconds"] == 0.100
    assert recent.summary()["p50Seconds"] == 0.051


def test_status_window_forgets_old_adds_and_memory_is_bounded() -> None:
    clock = Clock()
    recent = RecentDurations(size=10, window=300.0, clock=clock)
    recent.add(9.0)
    clock.now += 301
    assert recent.summary() == {
        "windowSeconds": 300.0,
        "count": 0,
        "p50Seconds": None,
        "p99Seconds": None,
    }
    for _ in range(50):
        recent.add(0.01)
    assert recent.summary()["count"] == 10
    assert len(recent._samples) == 10
