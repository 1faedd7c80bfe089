"""A cache's list comes page by page (agent.pods.cache.LIST_PAGE_SIZE) and keeps slim records;
the pod cache lists from the API server's watch cache (resourceVersion 0) but after an expired
version. The API server's side of paging is tested against the real one in tests/scale."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.errors import ResourceExpired
from agent.pods.cache import LIST_PAGE_SIZE, PodCache
from agent.pods.namespaces import NamespaceCache


@dataclass
class Reply:
    data: bytes


@dataclass
class PagedListDouble:
    """Test double of CoreV1Api.list_namespace: serves `names` in pages of the asked size,
    as the API server does (a continue token on every page but the last)."""

    names: list[str]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def list_namespace(self, **options: Any) -> Reply:
        self.calls.append(options)
        start = int(options.get("_continue") or 0)
        end = start + options["limit"]
        items = [
            {"metadata": {"name": n, "labels": {"n": n}, "managedFields": [{}]}, "status": {}}
            for n in self.names[start:end]
        ]
        meta = {"resourceVersion": "77"}
        if end < len(self.names):
            meta["continue"] = str(end)
        return Reply(json.dumps({"metadata": meta, "items": items}).encode())


def test_a_list_is_read_in_pages_into_slim_records() -> None:
    names = [f"ns-{i:04d}" for i in range(2 * LIST_PAGE_SIZE + 3)]
    core = PagedListDouble(names)
    cache = NamespaceCache(core, "node-1")
    assert cache.relist() == "77"
    assert [c.get("_continue") for c in core.calls] == [
        None,
        str(LIST_PAGE_SIZE),
        str(2 * LIST_PAGE_SIZE),
    ]
    assert all(c["limit"] == LIST_PAGE_SIZE and c["_preload_content"] is False for c in core.calls)
    assert len(cache.list_pods()) == len(names)
    assert cache.cached_namespace("ns-1000") == {
        "metadata": {"name": "ns-1000", "labels": {"n": "ns-1000"}}
    }


@dataclass
class PodListDouble:
    """Test double of CoreV1Api.list_pod_for_all_namespaces that records each call's options;
    it answers as the API server does for resourceVersion 0 (its watch cache: everything at
    once, no continue token) and pages otherwise."""

    pods: int
    calls: list[dict[str, Any]] = field(default_factory=list)

    def list_pod_for_all_namespaces(self, **options: Any) -> Reply:
        self.calls.append(options)
        start = int(options.get("_continue") or 0)
        end = self.pods if options.get("resource_version") == "0" else start + options["limit"]
        items = [
            {"metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}"}, "spec": {}}
            for i in range(start, min(end, self.pods))
        ]
        meta = {"resourceVersion": "90"}
        if end < self.pods:
            meta["continue"] = str(end)
        return Reply(json.dumps({"metadata": meta, "items": items}).encode())


def test_pod_lists_come_from_the_watch_cache_until_a_version_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = PodListDouble(pods=LIST_PAGE_SIZE + 1)
    cache = PodCache(core, "node-1")
    assert cache.step(None) == "90"
    assert core.calls[-1]["resource_version"] == "0"
    assert core.calls[-1]["field_selector"] == "spec.nodeName=node-1"
    assert len(cache.list_pods()) == LIST_PAGE_SIZE + 1

    def expired(version: str) -> str:
        raise ResourceExpired(f"watch from {version}: Gone")

    monkeypatch.setattr(cache, "watch_once", expired)
    assert cache.step("90") is None  # 410: the next list reads etcd, page by page
    core.calls.clear()
    assert cache.step(None) == "90"
    assert [c.get("resource_version") for c in core.calls] == [None, None]
    assert [c.get("_continue") for c in core.calls] == [None, str(LIST_PAGE_SIZE)]
    core.calls.clear()
    cache.step(None)  # and the one after that from the watch cache again
    assert [c.get("resource_version") for c in core.calls] == ["0"]


def test_namespace_lists_stay_consistent_and_paged() -> None:
    """A cluster's namespaces in one answer (the watch cache ignores pages) cost the agent 2 MiB
    more RSS with 2,000 of them (the scale tier's 10% bound): they come from etcd, paged."""
    core = PagedListDouble([f"ns-{i}" for i in range(3)])
    NamespaceCache(core, "node-1").relist()
    assert all("resource_version" not in c for c in core.calls)
