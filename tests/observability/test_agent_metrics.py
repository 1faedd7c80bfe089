"""The metrics added for operators, each at its source: refusals by reason (the handlers), the
install's ready timestamp (the watcher), the pod cache's size, staleness and relists (the cache,
fed the API's own event JSON), and rules apply failures by backend (the redirect, in a real
network namespace)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from agent.errors import ApiLookupError, RedirectError
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher
from agent.pods.metrics import CacheMetrics
from agent.pods.pod_cache import PodCache
from agent.podserver.metrics import REFUSAL_REASONS, PluginMetrics
from agent.rules.sidecar.redirector import RulesRedirector
from testbed.agent_host import Node, make_node
from testbed.wait import wait_for
from tests.podserver.helpers import (
    HandlerRig,
    InMemoryPods,
    ScriptedRedirector,
    build_rig,
    cni_body,
    make_pod,
)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return make_node(tmp_path)


def refused(rig: HandlerRig, reason: str) -> float:
    value = rig.registry.get_sample_value("istio_cni_pods_refused_total", {"reason": reason})
    return value or 0.0


# -- refusals ------------------------------------------------------------------------------------


def test_every_refusal_reason_is_exported_at_zero() -> None:
    registry = CollectorRegistry()
    PluginMetrics(registry)
    for reason in REFUSAL_REASONS:
        assert registry.get_sample_value("istio_cni_pods_refused_total", {"reason": reason}) == 0


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (
            lambda rig: setattr(rig.pods, "error", ApiLookupError("get pod app/web-0: 500")),
            "lookup_failed",
        ),
        (lambda rig: rig.pods.pods.clear(), "pod_not_found"),
        (
            lambda rig: setattr(rig.redirector, "decide_error", ValueError("bad pod")),
            "decision_failed",
        ),
        (
            lambda rig: setattr(rig.redirector, "apply_error", RedirectError("iptables: boom")),
            "apply_failed",
        ),
    ],
    ids=["lookup", "not-found", "decide", "apply"],
)
def test_a_refused_add_counts_its_reason_once(setup: Any, reason: str) -> None:
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    setup(rig)
    reply = rig.handlers.add(cni_body())
    assert reply.status >= 400
    assert refused(rig, reason) == 1
    assert sum(refused(rig, r) for r in REFUSAL_REASONS) == 1


def test_a_bad_request_is_refused_as_such() -> None:
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    assert rig.handlers.add(b"{not json").status == 400
    assert refused(rig, "bad_request") == 1


def test_served_adds_and_failed_checks_are_not_refusals() -> None:
    rig = build_rig(
        InMemoryPods(make_pod(), make_pod("plain", sidecar=False)),
        ScriptedRedirector(rules_in_place=False),
    )
    assert rig.handlers.add(cni_body()).body["result"] == "redirected"
    assert rig.handlers.add(cni_body(pod="plain", container_id="c2")).status == 200
    assert rig.handlers.check(cni_body("CHECK")).status == 500  # CHECK: not a pod start
    assert sum(refused(rig, r) for r in REFUSAL_REASONS) == 0


def test_an_unknown_reason_is_counted_as_internal_error() -> None:
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry)
    metrics.refused("web-0 exploded")  # never a free-form label value
    assert (
        registry.get_sample_value("istio_cni_pods_refused_total", {"reason": "internal_error"}) == 1
    )


# -- install ready timestamp ----------------------------------------------------------------------


def ready_since() -> float:
    return REGISTRY.get_sample_value("istio_cni_install_ready_timestamp_seconds") or 0.0


def test_install_ready_timestamp_is_set_when_the_install_becomes_ready(
    node: Node,
) -> None:
    watcher = InstallWatcher(
        Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    )
    before = ready_since()
    watcher.reconcile("start")  # no primary CNI config yet: waiting, not ready
    assert not watcher.ready() and ready_since() == before
    (node.conf_dir / "10-bridge.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "k8s", "plugins": [{"type": "bridge"}]})
    )
    started = time.time()
    watcher.reconcile("conf dir changed")
    assert watcher.ready()
    assert started - 1 <= ready_since() <= time.time() + 1
    stamped = ready_since()
    wait_for(lambda: time.time() > stamped, "the clock to pass the stamp", 1, interval=0.001)
    watcher.reconcile("recheck")  # still ready: the time it became ready stays
    assert ready_since() == stamped


# -- pod cache ------------------------------------------------------------------------------------


@pytest.fixture
def cache_rig() -> tuple[PodCache, CollectorRegistry]:
    registry = CollectorRegistry()
    return PodCache(core=None, node_name="node-1", metrics=CacheMetrics(registry)), registry


def sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"kind": "pod"})


def event(kind: str, pod: dict[str, Any], version: str) -> dict[str, Any]:
    pod["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": pod}


def test_cache_series_exist_before_the_first_list_and_read_as_never(
    cache_rig: tuple[PodCache, CollectorRegistry],
) -> None:
    _, registry = cache_rig
    assert sample(registry, "istio_cni_cache_objects") == 0
    assert sample(registry, "istio_cni_cache_last_event_timestamp_seconds") == 0
    assert sample(registry, "istio_cni_cache_relists_total") == 0


def test_cache_size_and_last_event_follow_watch_events(
    cache_rig: tuple[PodCache, CollectorRegistry],
) -> None:
    cache, registry = cache_rig
    started = time.time()
    cache.apply_event(event("ADDED", make_pod("a"), "10"), "9")
    cache.apply_event(event("ADDED", make_pod("b"), "11"), "10")
    assert sample(registry, "istio_cni_cache_objects") == 2
    heard = sample(registry, "istio_cni_cache_last_event_timestamp_seconds")
    assert heard is not None and heard >= started
    cache.apply_event(event("DELETED", make_pod("a"), "12"), "11")
    assert sample(registry, "istio_cni_cache_objects") == 1
    heard_at: float = heard
    wait_for(lambda: time.time() > heard_at, "the clock to pass the last event", 1, interval=0.001)
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}}
    cache.apply_event(bookmark, "12")  # a quiet node still hears bookmarks: not stale
    later = sample(registry, "istio_cni_cache_last_event_timestamp_seconds")
    assert later is not None and later > heard
    assert sample(registry, "istio_cni_cache_objects") == 1


class ListOnly:
    """A CoreV1Api stand-in answering one list (the list itself is tested against the real API
    server in tests/pods/test_cache.py; here only the counting is)."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.body = json.dumps({"metadata": {"resourceVersion": "5"}, "items": pods}).encode()

    def list_pod_for_all_namespaces(self, **_: Any) -> Any:
        return type("Response", (), {"data": self.body})()


def test_relists_count_and_set_the_size() -> None:
    registry = CollectorRegistry()
    cache = PodCache(
        ListOnly([make_pod("a"), make_pod("b"), make_pod("c")]),
        "node-1",
        metrics=CacheMetrics(registry),
    )
    cache.relist()
    cache.relist()
    assert sample(registry, "istio_cni_cache_relists_total") == 2
    assert sample(registry, "istio_cni_cache_objects") == 3
    assert (sample(registry, "istio_cni_cache_last_event_timestamp_seconds") or 0) > 0


# -- rules apply failures (real network namespace) ------------------------------------------------


def apply_failures(backend: str) -> float:
    value = REGISTRY.get_sample_value("istio_cni_rules_apply_failures_total", {"backend": backend})
    return value or 0.0


@pytest.mark.netns
def test_rules_apply_failure_is_counted_by_backend(pod_netns: Path) -> None:
    pod = make_pod()
    good = RulesRedirector(exclude_namespaces=(), backend="iptables-nft")
    before = apply_failures("iptables-nft")
    assert good.apply(str(pod_netns), pod) == "iptables-nft"
    assert apply_failures("iptables-nft") == before  # a success is not counted
    # A backend name the rules module does not know fails inside the apply (the config's
    # schema keeps it out in a real agent): counted, with the backend it could not name.
    bad = RulesRedirector(exclude_namespaces=(), backend="iptables-none")
    rig = build_rig(InMemoryPods(pod), bad)
    before_auto = apply_failures("auto")
    reply = rig.handlers.add(cni_body(netns=str(pod_netns)))
    assert reply.status == 500 and "unknown rule backend" in str(reply.body["msg"])
    assert apply_failures("auto") == before_auto + 1
    assert refused(rig, "apply_failed") == 1
