"""How the pod cache applies watch events, fed the API's own event JSON one at a time."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import ResourceExpired, WatchError
from agent.pods.pod_cache import PodCache
from tests.podserver.helpers import make_pod


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def versioned(pod: dict[str, Any], version: str) -> dict[str, Any]:
    pod["metadata"]["resourceVersion"] = version
    return pod


@pytest.fixture
def cache() -> PodCache:
    return PodCache(core=None, node_name="node-1")  # no API calls in these tests


def test_added_modified_deleted(cache: PodCache) -> None:
    version = cache.apply_event(event("ADDED", versioned(make_pod(), "10")), "9")
    assert version == "10"
    assert cache.cached("app", "web-0") is not None
    changed = versioned(make_pod(annotations={"sidecar.istio.io/interceptionMode": "TPROXY"}), "11")
    assert cache.apply_event(event("MODIFIED", changed), version) == "11"
    cached = cache.cached("app", "web-0")
    notes = cached["metadata"]["annotations"] if cached else {}
    assert notes["sidecar.istio.io/interceptionMode"] == "TPROXY"
    assert cache.apply_event(event("DELETED", versioned(make_pod(), "12")), "11") == "12"
    assert cache.cached("app", "web-0") is None
    assert cache.list_pods() == []


def test_bookmark_moves_the_version_only(cache: PodCache) -> None:
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "42"}}
    assert cache.apply_event(event("BOOKMARK", bookmark), "10") == "42"
    assert cache.list_pods() == []


def test_gone_error_event_means_relist(cache: PodCache) -> None:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version: 5 (200)",
    }
    with pytest.raises(ResourceExpired, match="too old resource version"):
        cache.apply_event(event("ERROR", status), "5")


def test_other_error_event_is_a_watch_error(cache: PodCache) -> None:
    status = {"kind": "Status", "code": 500, "message": "internal error"}
    with pytest.raises(WatchError, match="500"):
        cache.apply_event(event("ERROR", status), "5")


def test_deleting_an_unknown_pod_is_harmless(cache: PodCache) -> None:
    assert cache.apply_event(event("DELETED", versioned(make_pod(), "7")), "6") == "7"
    assert cache.list_pods() == []
