"""Reading only what the slim records keep (agent.pods.skim): the same records as from the whole
JSON, for every pod the slim tests know and every way a pod can be fat, at a fraction of the
memory; skipped values are found whole whatever they hold."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from agent.pods import list_body, skim, watch_stream
from agent.pods.pod_cache import PodCache
from agent.pods.slim import NAMESPACE, POD, PodFields, pod_shape, reading_of, slim
from tests.pods.test_slim import FAT_KINDS, fattened, full_pod, pods, readings

FIELDS = PodFields(labels=frozenset({"team.example/tier", "istio.io/dataplane-mode"}))


def skimmed(pod: Any, shape: Any = POD) -> Any:
    return slim(skim.loads(json.dumps(pod), reading_of(shape), whole_below=0), shape)


@pytest.mark.parametrize(("name", "manifest"), pods(), ids=[n for n, _ in pods()])
def test_the_records_are_those_of_the_whole_json(name: str, manifest: dict[str, Any]) -> None:
    pod = full_pod(manifest)
    for shape in (POD, pod_shape(FIELDS)):
        assert skimmed(pod, shape) == slim(json.loads(json.dumps(pod)), shape)


@pytest.mark.parametrize("kind", FAT_KINDS)
def test_a_fat_pod_reads_as_its_whole_json_and_costs_a_fraction(kind: str) -> None:
    pod = fattened(kind)
    text = json.dumps(pod)
    tracemalloc.start()
    try:
        whole = json.loads(text)
        _, whole_peak = tracemalloc.get_traced_memory()
        expected = slim(whole, POD)
        del whole
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        record = slim(skim.loads(text, reading_of(POD)), POD)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert record == expected
    assert readings(PodCache(core=None, node_name="node-1")._as_obj(record)) == readings(pod)
    assert peak - base < len(text) // 4, (kind, peak - base, whole_peak)  # json.loads: 2-12x


def test_a_namespace_keeps_its_labels_whole() -> None:
    ns = {
        "metadata": {
            "name": "team",
            "resourceVersion": "4",
            "labels": {"a": "b", "istio.io/dataplane-mode": "ambient"},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
        },
        "spec": {"finalizers": ["kubernetes"]},
    }
    assert skimmed(ns, NAMESPACE) == slim(ns, NAMESPACE)


@pytest.mark.parametrize(
    "value",
    [
        '"a \\" ] } [ { , \\\\"',
        '{"x": "]}", "y": [1, {"z": "[{"}], "w": "\\\\"}',
        '[[[], {}], ["\\u005d"], -1.5e3, true, null]',
        "12345",
        "false",
        '"caf\u00e9 \u2603 \U0001f600"',
    ],
)
def test_a_skipped_value_ends_where_it_ends(value: str) -> None:
    text = '{"skipped": ' + value + ', "kept": {"a": 1, "b": [2]}, "after": 3}'
    assert skim.loads(text, {"kept": {"a": skim.KEEP}, "after": skim.KEEP}, whole_below=0) == {
        "kept": {"a": 1},
        "after": 3,
    }


@pytest.mark.parametrize(
    "text",
    [
        '{"skipped": "open, "kept": 1}',
        '{"skipped": [1, 2}',
        '{"kept": tru}',
        '{"kept": 1} extra',
        '{"kept" 1}',
        '{"kept": 1,}',
        '{"skipped": {"a": 1]}',
    ],
)
def test_what_is_not_json_where_it_is_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        skim.loads(text, {"kept": skim.KEEP}, whole_below=0)


def test_items_are_kept_by_their_reading() -> None:
    env = skim.Items(
        {"name": skim.KEEP}, where=lambda e: e.get("name") != "x", unique=lambda e: len(e["name"])
    )
    text = '[{"name": "ab", "v": 1}, {"name": "x"}, {"name": "cd"}, {"name": "efg"}]'
    assert skim.loads(text, env, whole_below=0) == [
        {"name": "cd"},
        {"name": "efg"},
    ]  # the last of each length
    first = skim.Items(skim.KEEP, unique=len, last=False, first=2)
    assert skim.loads('["ab", "cd", "efg", "hijk"]', first, whole_below=0) == ["ab", "efg"]
    assert skim.loads('{"a": "not a list"}', {"a": first}, whole_below=0) == {"a": "not a list"}
    assert skim.loads('{"a": [1], "b": 2}', {"b": skim.KEEP}) == {"a": [1], "b": 2}  # small: whole


def test_watch_events_keep_what_the_cache_reads_of_them() -> None:
    reading = reading_of(POD)
    error = b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "gone"}}'
    assert watch_stream.decode(error, reading) == {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "message": "gone"},
    }
    bookmark = b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}'
    assert watch_stream.decode(memoryview(bookmark), reading)["object"] == {
        "metadata": {"resourceVersion": "9"}
    }
    fat = json.dumps({"type": "MODIFIED", "object": fattened("labels")}).encode()
    assert slim(watch_stream.decode(fat, reading)["object"], POD) == slim(
        json.loads(fat)["object"], POD
    )


def test_a_list_of_fat_pods_reads_as_its_whole_json() -> None:
    items = [fattened(kind) for kind in ("app args", "proxy env", "labels")]
    text = json.dumps({"metadata": {"resourceVersion": "3"}, "items": items}).encode()
    chunks = [text[i : i + 4096] for i in range(0, len(text), 4096)]
    read, rest = list_body.read(chunks, lambda p: slim(p, POD), reading_of(POD))
    assert read == [slim(p, POD) for p in items] and rest == {"metadata": {"resourceVersion": "3"}}


class OneEventWatch:
    """A watch answering one event in one chunk (as the API server writes an event), then ending."""

    def __init__(self, line: bytes) -> None:
        self.line = line

    def list_pod_for_all_namespaces(self, **options: Any) -> OneEventWatch:
        return self

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield self.line

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("kind", ["app args", "labels", "proxy env"])
def test_the_cache_applies_a_fat_event_holding_little_more_than_its_text(kind: str) -> None:
    """json.loads of the event built all of it first: 11 to 15 MiB for 1.34 MiB of text."""
    pod = fattened(kind)
    pod["metadata"]["resourceVersion"] = "8"
    line = json.dumps({"type": "MODIFIED", "object": pod}).encode() + b"\n"
    cache = PodCache(OneEventWatch(line), "node-1")
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        assert cache.watch_once("7") == "8"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    meta = pod["metadata"]
    assert cache.cached(meta.get("namespace", ""), meta["name"]) is not None
    assert peak - base < 2 * len(line), (peak - base, len(line))
