"""The caches' list + watch loop against a strict fake API server (testbed.fakeapi) in the
faults client-go's reflector handles: a watch broken mid-stream resumes from the last event or
bookmark seen, not from the list's version; a watch that ends at once with nothing in it counts
as a failure and is backed off, not reopened in a loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent.kube import KubeClients
from agent.pods.cache import ListWatchCache
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache
from testbed.fakeapi import FakeApiServer, Reply, Request, watch_events
from testbed.wait import wait_for

NODE = "node-1"


def pod(name: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "app",
            "uid": f"uid-{name}",
            "resourceVersion": version,
        },
        "spec": {"nodeName": NODE},
        "status": {},
    }


def namespace(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def resetting_watch(make: Callable[[str, str], dict[str, Any]]) -> Callable[[Request], Reply]:
    """List at 100; the first watch brings 101, 102 and a bookmark at 150, then the connection
    is reset; later watches stay silent."""
    watches = 0
    lock = threading.Lock()

    def route(request: Request) -> Reply:
        nonlocal watches
        if request.query.get("watch") != "true":
            return Reply(body={"metadata": {"resourceVersion": "100"}, "items": [make("a", "90")]})
        with lock:
            watches += 1
            first = watches == 1
        if first:
            events = watch_events(
                ("ADDED", make("b", "101")),
                ("MODIFIED", make("a", "102")),
                ("BOOKMARK", {"metadata": {"resourceVersion": "150"}}),
            )
            return Reply(events=events, then="reset")
        return Reply(events=[], then="silent")

    return route


def lists_seen(fake_api: FakeApiServer, path: str) -> list[Request]:
    return [r for r in fake_api.seen("GET", path) if r.query.get("watch") != "true"]


def run_pod_cache(
    fake_api: FakeApiServer, clients: KubeClients, watch_reply: Reply, seconds: float
) -> PodCache:
    """A pod cache against a server whose list is empty at 100 and whose every watch gets
    `watch_reply`, run for `seconds` after its first list; stopped."""
    fake_api.route = lambda request: (
        watch_reply
        if request.query.get("watch") == "true"
        else Reply(body={"metadata": {"resourceVersion": "100"}, "items": []})
    )
    cache = PodCache(clients.core, NODE)
    cache.start()
    try:
        wait_for(cache.ready, "the first list")
        time.sleep(seconds)
    finally:
        cache.stop()
    return cache


CASES = [
    pytest.param(PodCache, "/api/v1/pods", pod, id="pods"),
    pytest.param(NamespaceCache, "/api/v1/namespaces", namespace, id="namespaces"),
]


@pytest.mark.parametrize(("kind", "path", "make"), CASES)
def test_a_broken_watch_resumes_from_the_last_version_seen(
    fake_api: FakeApiServer,
    fake_api_clients: KubeClients,
    kind: type[ListWatchCache],
    path: str,
    make: Callable[[str, str], dict[str, Any]],
) -> None:
    fake_api.route = resetting_watch(make)
    cache = kind(fake_api_clients.core, NODE, backoff_max_seconds=0.2)
    cache.start()
    try:
        wait_for(lambda: len(fake_api.seen("GET", path, watch="true")) >= 2, "the watch reopened")
    finally:
        cache.stop()
    asked = [r.query["resourceVersion"] for r in fake_api.seen("GET", path, watch="true")]
    assert asked[:2] == ["100", "150"], asked
    assert len(lists_seen(fake_api, path)) == 1  # no list again: the watch resumed
    assert cache.relists == 1  # no list again: the watch resumed


def test_an_empty_watch_is_backed_off_not_reopened_in_a_loop(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    cache = run_pod_cache(fake_api, fake_api_clients, Reply(events=[], then="end"), 2.0)
    watches = fake_api.seen("GET", "/api/v1/pods", watch="true")
    # client-go: a watch over in under a second with no event is an error, backed off
    # (0.5 s doubling here, with jitter): 1 + 1 s + 2 s... at most 3 in 2 s.
    assert 1 <= len(watches) <= 3, len(watches)
    assert cache.relists == 1


def test_a_server_answering_every_resume_with_410_is_backed_off(
    fake_api: FakeApiServer, fake_api_clients: KubeClients
) -> None:
    """A watch from the version the list just returned answered 410 (a server or proxy that
    answers every resume so): listing again at once would loop at the client's rate limit (5
    requests/s, list and watch in turn). As client-go's reflector, each round after the first
    is backed off, growing: 0.5 s doubling with jitter."""
    run_pod_cache(fake_api, fake_api_clients, Reply(status=410), 4.0)
    lists = lists_seen(fake_api, "/api/v1/pods")
    watches = fake_api.seen("GET", "/api/v1/pods", watch="true")
    # list, 410, list, 410, (~1 s) list, 410, (~2 s) list, 410: at most 4 of each in 4 s, where
    # the rate limit alone allowed about 15 of each.
    assert len(lists) <= 5 and len(watches) <= 5, (len(lists), len(watches))
    assert len(watches) >= 2
    # After the first 410 the list is consistent (from etcd, not the watch cache).
    assert all(r.query.get("resourceVersion", "") == "" for r in lists[1:])
