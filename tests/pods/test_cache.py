"""The pod cache (agent.pods.cache) against the test bed's real kube-apiserver and etcd."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent.kube import build_clients
from agent.pods.pod_cache import PodCache
from testbed.node import NodePods
from testbed.wait import wait_for
from tests.podserver.helpers import ObservedCore

pytestmark = pytest.mark.cluster

# How long the API server may take to deliver an event: generous, these are not timings.
EVENTUAL = 30.0
# The watch cache keeps events at least 75 s; expiring one takes that plus a full buffer.
EXPIRY_DEADLINE = 300.0
# stop() cuts an open watch at once; the server would end it only after watch_timeout_seconds.
STOP_BOUND = 5.0


@pytest.fixture
def namespace(random_namespace_function_scope: Any) -> str:
    return str(random_namespace_function_scope.name)


@pytest.fixture
def agent_core(kube_config: str) -> Iterator[Any]:
    """The agent's own client (agent.kube.rest), as the admin."""
    clients = build_clients({"KUBECONFIG": kube_config})
    try:
        yield clients.core
    finally:
        clients.close()


@pytest.fixture
def make_cache(agent_core: Any, sim_node: str) -> Iterator[Callable[..., PodCache]]:
    made: list[PodCache] = []

    def make(core: Any = None, **options: Any) -> PodCache:
        made.append(PodCache(core or agent_core, sim_node, **options))
        return made[-1]

    yield make
    for cache in made:
        cache.stop()


@pytest.fixture
def running_cache(make_cache: Callable[..., PodCache]) -> PodCache:
    cache = make_cache()
    cache.start()
    wait_for(cache.ready, "pod cache listed the node's pods", EVENTUAL)
    return cache


def test_pod_on_the_node_appears_then_disappears(
    running_cache: PodCache, node_pods: NodePods, namespace: str
) -> None:
    created = node_pods.create(namespace, "web-0")
    wait_for(lambda: running_cache.cached(namespace, "web-0"), "pod in the cache", EVENTUAL)
    pod = running_cache.cached(namespace, "web-0")
    assert pod is not None
    assert pod["metadata"]["uid"] == created["metadata"]["uid"]
    assert pod["spec"]["nodeName"] == node_pods.node_name
    assert pod["spec"]["containers"] == []  # API JSON, camelCase keys; no app container kept
    node_pods.delete(namespace, "web-0")
    wait_for(
        lambda: running_cache.cached(namespace, "web-0") is None, "pod left the cache", EVENTUAL
    )


def test_annotation_change_reaches_the_cache(
    running_cache: PodCache, node_pods: NodePods, namespace: str, kube_core: Any
) -> None:
    node_pods.create(namespace, "web-0")
    wait_for(lambda: running_cache.cached(namespace, "web-0"), "pod in the cache", EVENTUAL)
    kube_core.patch_namespaced_pod(
        "web-0", namespace, {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}}
    )

    def annotated() -> bool:
        pod = running_cache.cached(namespace, "web-0") or {}
        annotations = pod.get("metadata", {}).get("annotations") or {}
        return bool(annotations.get("sidecar.istio.io/inject") == "false")

    wait_for(annotated, "MODIFIED event applied", EVENTUAL)


def test_pod_on_another_node_never_appears(
    running_cache: PodCache, node_pods: NodePods, namespace: str, kube_core: Any
) -> None:
    other = NodePods(kube_core, "some-other-node")
    try:
        other.create(namespace, "elsewhere")
        # Events arrive in order: once a later pod of our node is cached, the other one
        # would have been too.
        node_pods.create(namespace, "marker")
        wait_for(lambda: running_cache.cached(namespace, "marker"), "marker pod", EVENTUAL)
        assert running_cache.cached(namespace, "elsewhere") is None
        assert {
            p["metadata"]["name"]
            for p in running_cache.list_pods()
            if p["metadata"]["namespace"] == namespace
        } == {"marker"}
    finally:
        other.close()


def test_first_list_includes_existing_pods(
    make_cache: Callable[..., PodCache], node_pods: NodePods, namespace: str
) -> None:
    node_pods.create(namespace, "before-start")
    cache = make_cache()
    assert not cache.ready()
    cache.start()
    wait_for(cache.ready, "first list", EVENTUAL)
    # From the watch cache (resourceVersion 0): a pod created a moment before may come with the
    # watch that follows the list rather than in it, as with client-go's informers.
    wait_for(lambda: cache.cached(namespace, "before-start"), "the pod made before", EVENTUAL)


def test_expired_resource_version_leads_to_a_relist(
    make_cache: Callable[..., PodCache], node_pods: NodePods, namespace: str, kube_core: Any
) -> None:
    """A real 410: the API server's watch cache drops events older than its window (~75 s and
    a full buffer), so a version from before enough churn expires. The next round lists."""
    cache = make_cache(watch_timeout_seconds=1, resync_seconds=3600)  # driven by hand
    old = cache.step(None)
    assert old is not None and cache.relists == 1
    node_pods.create(namespace, "while-away")
    churn = NodePods(kube_core, "churn-node")
    try:
        churn.create(namespace, "churn")
        deadline = time.monotonic() + EXPIRY_DEADLINE
        expired = False
        patches = 0
        while not expired:
            assert time.monotonic() < deadline, f"no 410 after {patches} changes"
            for _ in range(50):
                patches += 1
                kube_core.patch_namespaced_pod(
                    "churn", namespace, {"metadata": {"annotations": {"n": str(patches)}}}
                )
            # Not expired yet: the watch resumes from `old` and returns a newer version.
            expired = cache.step(old) is None
    finally:
        churn.close()
    assert cache.relists == 1
    assert cache.step(None) is not None  # the next round lists again
    assert cache.relists == 2
    assert cache.cached(namespace, "while-away") is not None


def test_watch_resumes_after_the_server_ends_it(
    make_cache: Callable[..., PodCache], node_pods: NodePods, namespace: str, agent_core: Any
) -> None:
    observed = ObservedCore(agent_core)
    # The server closes each watch after 1 s.
    cache = make_cache(core=observed, watch_timeout_seconds=1)
    cache.start()
    # The first watch ends after 1 s and the cache opens a second one from its version.
    wait_for(lambda: observed.watches >= 2, "a second watch", EVENTUAL, interval=0.01)
    node_pods.create(namespace, "after-reconnect")
    wait_for(lambda: cache.cached(namespace, "after-reconnect"), "pod cached", EVENTUAL)
    assert cache.relists == 1 and observed.lists == 1  # resumed from its version, no relist


def test_by_default_no_relist_and_watch_timeouts_drawn_apart(
    make_cache: Callable[..., PodCache], agent_core: Any
) -> None:
    """As client-go's informers: no list on a timer (a resumed watch misses nothing), and each
    watch's timeout drawn from [T, 2T), so agents started together do not re-watch together."""
    observed = ObservedCore(agent_core)
    # The default resync (none); a short T so several watches end within the test.
    cache = make_cache(core=observed, watch_timeout_seconds=1)
    cache.start()
    wait_for(lambda: observed.watches >= 4, "four watches", EVENTUAL, interval=0.01)
    assert cache.relists == 1 and observed.lists == 1
    cache.stop()

    draws: list[int] = []
    for _ in range(3):  # three caches with the default T (240 s): their first watches' timeouts
        watched = ObservedCore(agent_core)
        cache = make_cache(core=watched)
        cache.start()
        wait_for(lambda: watched.watches >= 1, "a watch opened", EVENTUAL, interval=0.01)  # noqa: B023
        cache.stop()
        draws.extend(watched.watch_timeouts)
    assert len(draws) == 3 and all(240 <= t < 480 for t in draws), draws
    assert len(set(draws)) > 1, f"three watches, one timeout: {draws}"


def test_periodic_resync_lists_again(
    make_cache: Callable[..., PodCache], node_pods: NodePods, namespace: str
) -> None:
    cache = make_cache(resync_seconds=1)
    cache.start()
    wait_for(lambda: cache.relists >= 3, "three lists", EVENTUAL)
    node_pods.create(namespace, "after-resyncs")
    wait_for(lambda: cache.cached(namespace, "after-resyncs"), "pod cached", EVENTUAL)


def test_fallback_get_finds_a_pod_not_in_the_cache(
    make_cache: Callable[..., PodCache], node_pods: NodePods, namespace: str
) -> None:
    created = node_pods.create(namespace, "fresh")
    cache = make_cache()  # never started: its store is empty
    assert cache.cached(namespace, "fresh") is None
    pod = cache.get(namespace, "fresh", created["metadata"]["uid"])
    assert pod is not None and pod["metadata"]["name"] == "fresh"
    assert cache.get(namespace, "fresh", "some-other-uid") is None  # recreated-pod guard


def test_get_of_a_missing_pod_gives_up_with_none(
    make_cache: Callable[..., PodCache], namespace: str
) -> None:
    cache = make_cache()
    assert cache.get(namespace, "never-created") is None


def test_get_waits_for_a_pod_created_during_the_retries(
    running_cache: PodCache, node_pods: NodePods, namespace: str
) -> None:
    import threading

    creator = threading.Timer(0.3, lambda: node_pods.create(namespace, "late"))
    creator.start()
    try:
        # 5 tries over ~2 s: the pod created 0.3 s in is found (from the watch or the GET).
        pod = running_cache.get(namespace, "late")
    finally:
        creator.join()
    assert pod is not None and pod["metadata"]["name"] == "late"


def test_stop_returns_while_a_watch_is_open(
    make_cache: Callable[..., PodCache], agent_core: Any
) -> None:
    observed = ObservedCore(agent_core)
    cache = make_cache(core=observed, watch_timeout_seconds=240)
    cache.start()
    wait_for(lambda: observed.watches >= 1, "a watch opened", EVENTUAL, interval=0.01)
    started = time.monotonic()
    cache.stop()  # must cut the stream, not wait for the server to end the watch (240 s)
    took = time.monotonic() - started
    assert took < STOP_BOUND, f"stop() took {took:.2f}s with a watch open"
    cache.stop()  # idempotent
