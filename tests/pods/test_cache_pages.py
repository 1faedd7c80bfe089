"""A cache's list comes page by page (agent.pods.cache.LIST_PAGE_SIZE) and keeps slim records.
The API server's side of paging is tested against the real one in tests/scale."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.pods.cache import LIST_PAGE_SIZE
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
