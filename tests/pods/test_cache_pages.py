"""A cache's list comes page by page (agent.pods.cache.LIST_PAGE_SIZE) and keeps slim records;
the pod cache lists from the API server's watch cache (resourceVersion 0) but after an expired
version. The API server's side of paging is tested against the real one in tests/scale."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent.errors import KubeApiError, ResourceExpired
from agent.pods import list_body
from agent.pods.cache import LIST_PAGE_SIZE
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache


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
    # 410 on a watch resumed from a later event's version: the next list reads etcd, page by
    # page (from the list's own version it would be a failure, backed off: test_cache_watch_faults)
    assert cache.step("95") is None
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


@dataclass
class FatPodsDouble:
    """list_pod_for_all_namespaces answering `pods` pods of `size` bytes of container args."""

    pods: int
    size: int
    answer: bytes = b""

    def __post_init__(self) -> None:
        items = [self.pod(i) for i in range(self.pods)]
        body = {"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": items}
        self.answer = json.dumps(body, separators=(",", ":")).encode()

    def pod(self, i: int) -> dict[str, Any]:
        args = [f"{j % 100:02d}" for j in range(self.size // 5)]
        containers = [{"name": "app", "args": args}, {"name": "istio-proxy", "args": ["proxy"]}]
        meta = {"name": f"fat{i}", "namespace": "ns", "uid": f"u{i}", "resourceVersion": "5"}
        return {"metadata": meta, "spec": {"nodeName": "node-1", "containers": containers}}

    def list_pod_for_all_namespaces(self, **options: Any) -> Streamed:
        return Streamed(self.answer)


@dataclass
class Streamed:
    """A raw answer as urllib3 streams it."""

    data: bytes
    released: bool = False

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        yield from (self.data[i : i + amt] for i in range(0, len(self.data), amt))

    def release_conn(self) -> None:
        self.released = True


def test_a_list_is_read_one_item_at_a_time() -> None:
    """A list of fat pods costs, while it is read, its text and one pod parsed: never every
    pod parsed at once (a relist of a node's fat pods would cost them all, some 12 times the
    size of their JSON)."""
    core = FatPodsDouble(pods=8, size=300_000)
    tracemalloc.start()
    try:
        one = json.loads(json.dumps(core.pod(0)))
        one_pod, _ = tracemalloc.get_traced_memory()
        del one
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        cache = PodCache(core, "node-1")
        assert cache.relist() == "9"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache.list_pods()) == core.pods
    assert cache.cached("ns", "fat3") == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fat3", "namespace": "ns", "uid": "u3", "resourceVersion": "5"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "istio-proxy", "args": ["proxy"]}]},
    }
    # One pod's text (read on in doubling steps), and one pod parsed: not the answer's whole.
    text = len(core.answer) // core.pods
    assert peak - base < 4 * text + 2 * one_pod, (peak - base, text, one_pod)


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        ' {"items": [], "metadata": {"resourceVersion": "1"}} ',
        '{"kind":"PodList","items":[{"a":[1,{"b":null}]}, 2 ,"s"],"metadata":{"continue":"x"}}',
        '{"items": null, "metadata": {}}',
        '{"items": [1], "items": [2, 3]}',
        '{"items": [1], "items": null}',
        '{"metadata": {"resourceVersion": "1"}, "items": [{"x": "\\u00e9\\n"}]}',
        '{"items": [{"n": 12345, "f": -1.5e3, "t": true, "z": null}], "n": 678}',
        '{"items": [{"s": "caf\u00e9 \u2603 \U0001f600"}]}',
    ],
)
@pytest.mark.parametrize("size", [1, 2, 3, 5, 64, 1 << 16])
def test_a_list_reads_as_json_loads_reads_it(text: str, size: int) -> None:
    """However the answer's chunks cut it (in a number, a string, an escape, a character)."""
    items, rest = list_body.read(Streamed(text.encode()).stream(size, True), lambda item: item)
    whole = json.loads(text)
    assert items == (whole.get("items") or [])
    assert rest == {k: v for k, v in whole.items() if k != "items" or v is None}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "{",
        '{"a"}',
        '{"a":1,}',
        '{"items":[{},]}',
        '{"items":[{} {}]}',
        "{} x",
        "{1:2}",
        '{"items":[{}]',
    ],
)
def test_a_list_that_is_not_one_object_is_an_api_error(text: str) -> None:
    for size in (1, 1 << 16):
        with pytest.raises(ValueError):
            list_body.read(Streamed(text.encode()).stream(size, True), lambda item: item)
        with pytest.raises(ValueError):  # not UTF-8
            list_body.read(Streamed(b'{"a":"\xff"}').stream(size, True), lambda item: item)
    core = PodListDouble(pods=0)
    core.list_pod_for_all_namespaces = lambda **options: Reply(text.encode())  # type: ignore[method-assign]
    with pytest.raises(KubeApiError):
        PodCache(core, "node-1").relist()
