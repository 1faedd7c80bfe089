"""The caches' slim records (agent.pods.slim): every reader of a cached pod decides on the slim
record as on the full object the API server sent, and the record is a fraction of its size."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agent.ambient.enrollment import (
    REDIRECTION_ANNOTATION,
    ZTUNNEL_APP,
    redirection_state,
    should_enroll,
)
from agent.ambient.mesh import ambient_pod
from agent.config import AmbientSettings, RepairSettings, Settings
from agent.errors import InvalidPodInputError
from agent.label_selectors import EnablementSelector, LabelSelector, LabelSelectorRequirement
from agent.podinput.pod import PROXY_ENV, ambient_input
from agent.pods import slim as slim_module
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache
from agent.pods.slim import NAMESPACE, POD, PodFields, pod_shape, slim
from agent.podserver.service import PodService
from agent.readiness.build import _own_netns_uid
from agent.repair.detect import is_running_with_addresses, pod_key, validation_failed
from agent.rules.sidecar.pod import INIT_CONTAINER, capture_config_for_pod, decide, ipv6_for_pod

CONFORMANCE = Path(__file__).resolve().parents[1] / "testdata" / "istio-conformance" / "plugin"

# What the API server adds to every pod, none of which the agent reads.
CLUTTER: dict[str, Any] = {
    "metadata": {
        "generateName": "web-7d9f-",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9f", "uid": "rs-1"}],
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "fieldsType": "FieldsV1",
                "fieldsV1": {f"f:spec{i}": {"f:containers": {}} for i in range(40)},
            }
        ],
    },
    "spec": {
        "volumes": [{"name": f"v{i}", "projected": {"sources": [{"token": {}}]}} for i in range(4)],
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}],
        "serviceAccountName": "default",
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
    },
    "status": {
        "conditions": [{"type": t, "status": "True"} for t in ("Ready", "Initialized")],
        "containerStatuses": [{"name": "app", "imageID": "sha256:" + "a" * 64, "ready": True}],
        "qosClass": "BestEffort",
        "hostIP": "10.0.0.1",
    },
}
CONTAINER_CLUTTER = {
    "image": "registry.example/proxyv2:1.29",
    "resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
    "volumeMounts": [{"name": f"v{i}", "mountPath": f"/var/run/{i}"} for i in range(4)],
    "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}},
    "ports": [{"containerPort": 15090, "name": "http-envoy-prom"}],
}


def merged(base: Any, extra: Any) -> Any:
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for key, value in extra.items():
            out[key] = merged(base[key], value) if key in base else value
        return out
    return base


def full_pod(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` as the API server would send it back: with everything the agent never reads."""
    pod: dict[str, Any] = merged(copy.deepcopy(manifest), copy.deepcopy(CLUTTER))
    for key in ("containers", "initContainers"):
        for container in pod["spec"].get(key) or []:
            container.update(copy.deepcopy(CONTAINER_CLUTTER))
    return pod


def pods() -> list[tuple[str, dict[str, Any]]]:
    found = [
        (path.parent.name, yaml.safe_load(path.read_text()))
        for path in sorted(CONFORMANCE.glob("*/pod.yaml"))
    ]
    assert len(found) >= 5, "the conformance pods are where they were"
    proxy = {
        "name": "istio-proxy",
        "args": ["proxy", "router"],
        "env": [
            {"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
            {"name": "INVALID_DROP", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
            "not a mapping",
        ],
        "securityContext": {"runAsUser": "1337"},  # a string: refused by the parser
    }
    found.append(
        (
            "router-and-refused-uid",
            {
                "metadata": {
                    "name": "gw",
                    "namespace": "istio-ingress",
                    "annotations": {
                        "sidecar.istio.io/status": "{}",
                        "ambient.istio.io/redirection": "enabled",
                        "ambient.istio.io/dns-capture": "false",
                    },
                    "labels": {"istio.io/dataplane-mode": "ambient"},
                },
                "spec": {"serviceAccountName": "gateway", "containers": [proxy]},
            },
        )
    )
    failed_init = {
        "metadata": {"name": "broken", "namespace": "app", "uid": "u-2"},
        "spec": {"initContainers": [{"name": "istio-validation"}], "containers": [{"name": "a"}]},
        "status": {
            "phase": "Pending",
            "podIP": "10.1.0.7",
            "podIPs": [{"ip": "10.1.0.7"}, {"ip": "fd00::7"}],
            "initContainerStatuses": [
                {
                    "name": "istio-validation",
                    "image": "proxyv2:1",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 126, "message": "no rules"}},
                }
            ],
        },
    }
    found.append(("failed-validation", failed_init))
    host_network = {
        "metadata": {"name": "h", "namespace": "app", "uid": "u-3"},
        "spec": {"hostNetwork": True, "containers": [{"name": "istio-proxy"}]},
    }
    found.append(("host-network", host_network))
    return found


def outcome(call: Any) -> Any:
    try:
        return call()
    except InvalidPodInputError as e:
        return f"refused: {e}"


def readings(pod: dict[str, Any]) -> list[Any]:
    """What each reader of a cached pod makes of it."""
    by_label = LabelSelector(matchLabels=(("istio.io/dataplane-mode", "ambient"),))
    ambient = [EnablementSelector(podSelector=by_label)]
    return [
        decide(pod, exclude_namespaces=["kube-system"]),
        outcome(lambda: capture_config_for_pod(pod, ipv6=False)),
        ipv6_for_pod(pod, ["fd00::7"]),
        validation_failed(pod, init_container_name="istio-validation", exit_code=126),
        validation_failed(
            pod, init_container_name="istio-validation", termination_message="no rules"
        ),
        is_running_with_addresses(pod),
        pod_key(pod),
        _own_netns_uid(pod),
        should_enroll(pod, {"metadata": {"labels": {"a": "b"}}}, ambient),
        outcome(lambda: ambient_input(pod)),
        ambient_pod(pod, "/var/run/netns/x").service_account,
        redirection_state(pod),
    ]


@pytest.mark.parametrize(("name", "manifest"), pods(), ids=[n for n, _ in pods()])
def test_every_reader_decides_alike_on_the_slim_record(name: str, manifest: dict[str, Any]) -> None:
    full = full_pod(manifest)
    before = copy.deepcopy(full)
    record = slim(full, POD)
    assert full == before, "the full object is left as it was"
    assert readings(record) == readings(full)
    assert len(json.dumps(record)) * 3 < len(json.dumps(full)), name


def test_what_a_record_keeps() -> None:
    record = PodCache(core=None, node_name="node-1")._as_obj(full_pod(dict(pods())["basic"]))
    assert set(record) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert record["status"] == {}  # conditions, container statuses, QoS class: none read
    assert "managedFields" not in record["metadata"]
    assert set(record["spec"]) == {"containers", "serviceAccountName"}
    assert [c["name"] for c in record["spec"]["containers"]] == ["istio-proxy"]  # no app
    for container in record["spec"]["containers"]:
        assert set(container) <= {"name", "args", "env", "securityContext"}


ODD = [
    {"spec": {"containers": "not a list", "initContainers": [1, {"name": "istio-init"}]}},
    {"spec": {"containers": [{"name": "istio-proxy", "args": "proxy sidecar", "env": {"a": 1}}]}},
    {"spec": {"containers": [{"name": "istio-proxy", "securityContext": {"runAsUser": [1]}}]}},
    {"spec": {"containers": [{"name": "istio-proxy", "securityContext": "root"}]}},
    {"spec": {"containers": [{"name": "istio-proxy", "args": ["proxy", {"type": "x"}]}]}},
    {"spec": {"containers": [{"name": "istio-proxy", "env": [{"name": "DISABLE_ENVOY"}]}]}},
    {"metadata": {"labels": "app=x", "annotations": ["sidecar.istio.io/status"]}},
]


@pytest.mark.parametrize("odd", ODD, ids=[str(i) for i in range(len(ODD))])
def test_values_of_another_kind_read_alike_or_are_refused(odd: dict[str, Any]) -> None:
    """What the API server never sends: the slim record decides alike, or the parser refuses
    it (a value of another kind is never kept whole: it could be any size)."""
    odd = {"metadata": {"name": "p", "namespace": "app"}} | odd
    full_readings, slim_readings = readings(odd), readings(slim(odd, POD))
    for whole, kept in zip(full_readings, slim_readings, strict=True):
        assert verdict(kept) == verdict(whole) or str(kept).startswith("refused:"), (whole, kept)


def verdict(reading: Any) -> Any:
    """A decision's verdict and the start of its reason (the rest may quote the value)."""
    reason = getattr(reading, "reason", None)
    if not isinstance(reason, str) or isinstance(reading, type):
        return reading
    return dataclasses.astuple(reading)[0], reason.split(" ")[:3]


def test_a_namespace_is_its_name_and_labels() -> None:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "shop",
            "uid": "n-1",
            "resourceVersion": "9",
            "labels": {"istio.io/dataplane-mode": "ambient"},
            "annotations": {"big": "x" * 4000},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }
    kept = NamespaceCache(core=None, node_name="node-1")._as_obj(namespace)
    assert kept == slim(namespace, NAMESPACE)
    assert kept == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "shop",
            "resourceVersion": "9",
            "labels": {"istio.io/dataplane-mode": "ambient"},
        },
    }


# --- a pod's cost is bounded by what the agent reads ------------------------------------------

FAT = 1_400_000
"""JSON bytes of a fat pod: under etcd's object limit (1.5 MiB), so the API server stores it."""
RECORD_BOUND = 16 * 1024
"""What the record of a pod keeping no long value may cost (a plain one: some 3 KiB)."""


def retained(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by `obj` and everything it references (each object once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(retained(k, seen) + retained(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        size += sum(retained(item, seen) for item in obj)
    return size


def filled(make: Callable[[int], Any], budget: int) -> list[Any]:
    """As many `make(i)` as fit in `budget` bytes of a JSON list."""
    items: list[Any] = []
    size = 0
    while size + len(json.dumps(make(len(items)))) + 2 <= budget:
        size += len(json.dumps(make(len(items)))) + 2  # and ", "
        items.append(make(len(items)))
    return items


def filled_map(make: Callable[[int], str], budget: int) -> dict[str, str]:
    """As many `make(i): ""` entries as fit in `budget` bytes of a JSON object."""
    entries: dict[str, str] = {}
    size = 0
    while size + len(json.dumps(make(len(entries)))) + 6 <= budget:
        size += len(json.dumps(make(len(entries)))) + 6  # and `: ""` and ", "
        entries[make(len(entries))] = ""
    return entries


def fattened(kind: str) -> dict[str, Any]:
    """A sidecar pod grown to FAT bytes, as its owner may grow it."""
    pod = full_pod(dict(pods())["basic"])
    pod["spec"]["nodeName"] = "node-1"  # set by the owner: the pod is this node's at once
    room = FAT - len(json.dumps(pod)) - 100  # the new key itself
    app, proxy = pod["spec"]["containers"][0], proxy_of(pod)
    if kind == "app args":
        app["args"] = filled(lambda i: f"{i % 100:02d}", room)
    elif kind == "proxy args":
        proxy["args"] = ["proxy", "sidecar", *filled(lambda i: f"{i % 100:02d}", room)]
    elif kind == "proxy env":
        proxy["env"] = filled(lambda i: {"name": f"E{i}", "value": ""}, room)
    elif kind == "read env names":
        proxy["env"] = filled(lambda i: {"name": "INVALID_DROP", "value": str(i % 2 == 0)}, room)
    elif kind == "containers":
        pod["spec"]["initContainers"] = filled(lambda i: {"name": f"c{i}", "image": "x"}, room)
    elif kind == "labels":
        pod["metadata"]["labels"] = filled_map(lambda i: f"l{i}", room)
    elif kind == "annotations":  # the API server's limit on all of them: 256 KiB
        pod["metadata"]["annotations"] |= filled_map(lambda i: f"a{i}", 250_000)
    elif kind == "init statuses":
        status = {"name": "x", "state": {"waiting": {"reason": "PodInitializing"}}}
        pod["status"]["initContainerStatuses"] = filled(lambda i: status | {"name": f"c{i}"}, room)
    assert 0.9 * FAT < len(json.dumps(pod)) <= FAT or kind == "annotations", len(json.dumps(pod))
    return pod


def proxy_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")


FAT_KINDS = [
    "app args",
    "proxy args",
    "proxy env",
    "read env names",
    "containers",
    "labels",
    "annotations",
    "init statuses",
]


@pytest.mark.parametrize("kind", FAT_KINDS)
def test_a_fat_pod_costs_what_the_agent_reads(kind: str) -> None:
    full = fattened(kind)
    record = PodCache(core=None, node_name="node-1")._as_obj(json.loads(json.dumps(full)))
    assert retained(record) < RECORD_BOUND, f"{retained(record)} bytes kept of {kind}"
    assert readings(record) == readings(full)


def test_the_largest_record_is_bounded() -> None:
    """Every value the agent reads at its longest: the record's bound, whatever the pod."""
    long = "x" * slim_module.TEXT_LIMIT
    fields = PodFields(labels=frozenset(f"team{i}.example/k" for i in range(8)))
    pod = full_pod(dict(pods())["basic"])
    meta = pod["metadata"]
    meta["annotations"] = dict.fromkeys(slim_module.ANNOTATIONS, long)
    meta["labels"] = dict.fromkeys(slim_module.LABELS | fields.labels, "v" * 63)
    proxy = {
        "name": "istio-proxy",
        "args": [long, long],
        "env": [{"name": name, "value": long} for name in PROXY_ENV],
        "securityContext": {"runAsUser": 10**4000, "runAsGroup": 10**4000},
    }
    pod["spec"]["containers"] = [proxy, {"name": "istio-init"}]
    pod["spec"]["initContainers"] = [proxy, {"name": "istio-init"}]
    terminated = {"exitCode": 126, "reason": long, "message": long}
    status = {"name": "istio-validation", "state": {"terminated": terminated}}
    pod["status"]["initContainerStatuses"] = [status | {"lastState": status["state"]}] * 100
    strings = len(slim_module.ANNOTATIONS) + 2 * (2 + len(PROXY_ENV))
    strings += 4 * slim_module.LIST_LIMIT
    bound = strings * (slim_module.TEXT_LIMIT + 100) + 4 * RECORD_BOUND
    record = slim(pod, pod_shape(fields))
    assert retained(record) < bound


CUT_VALUES = [
    ("annotation traffic.sidecar.istio.io/excludeOutboundIPRanges", "metadata", "10.0.0.0/8,"),
    ("istio-proxy env ISTIO_META_DNS_CAPTURE", "env", "x"),
    ("annotation sidecar.istio.io/inject", "inject", "y"),
]


@pytest.mark.parametrize(("where", "field", "unit"), CUT_VALUES, ids=[w for w, _, _ in CUT_VALUES])
def test_a_value_the_agent_parses_is_never_read_cut(where: str, field: str, unit: str) -> None:
    """Past TEXT_LIMIT the record keeps a Cut: the pod is refused, naming the value, rather
    than captured by a part of it."""
    pod = full_pod(dict(pods())["basic"])
    value = unit * (slim_module.TEXT_LIMIT // len(unit) + 1)
    if field == "env":
        proxy_of(pod)["env"] = [{"name": "ISTIO_META_DNS_CAPTURE", "value": value}]
    elif field == "inject":
        pod["metadata"]["annotations"]["sidecar.istio.io/inject"] = value
    else:
        pod["metadata"]["annotations"][where.split(" ")[1]] = value
    record = slim(pod, POD)
    with pytest.raises(InvalidPodInputError, match="characters the agent keeps") as refused:
        decide(record, exclude_namespaces=[]) and capture_config_for_pod(record, ipv6=False)
    assert str(refused.value).startswith(f"{where}: invalid value")


def test_labels_the_settings_select_by_are_kept() -> None:
    team = LabelSelector(matchLabels=(("team.example/mesh", "yes"),))
    gone = LabelSelector(
        matchExpressions=(LabelSelectorRequirement(key="legacy", operator="DoesNotExist"),)
    )
    selectors = (EnablementSelector(podSelector=team), EnablementSelector(podSelector=gone))
    settings = Settings(
        ambient=AmbientSettings(enablementSelectors=selectors),
        repair=RepairSettings(labelKey="broken.example/pod"),
    )
    fields = PodFields.of(settings)
    assert {"team.example/mesh", "legacy", "broken.example/pod"} <= fields.labels
    for labels in ({"team.example/mesh": "yes"}, {"legacy": "1"}, {"other": "x"}):
        pod = full_pod(dict(pods())["basic"]) | {"metadata": {"name": "a", "labels": labels}}
        record = slim(pod, pod_shape(fields))
        ns: dict[str, Any] = {"metadata": {"labels": {}}}
        assert should_enroll(record, ns, selectors) == should_enroll(pod, ns, selectors)
        assert set(record["metadata"]["labels"]) == set(labels) & fields.labels


def test_every_pod_key_the_readers_name_is_kept() -> None:
    """Each `*.io/...` key the readers of a pod look up is an annotation or label kept."""
    readers = [
        "podinput/pod.py",
        "rules/sidecar/pod.py",
        "ambient/enrollment.py",
        "repair/detect.py",
    ]
    root = Path(__file__).resolve().parents[2] / "agent"
    named = set()
    for reader in readers:
        named |= set(re.findall(r'"([a-z.]+\.io/[A-Za-z-]+)"', (root / reader).read_text()))
    assert named, "the readers name their keys as they did"
    assert named <= slim_module.ANNOTATIONS | slim_module.LABELS | PodFields().labels
    assert REDIRECTION_ANNOTATION in slim_module.ANNOTATIONS
    assert INIT_CONTAINER == slim_module.INIT_CONTAINER
    assert ZTUNNEL_APP == "ztunnel" and slim_module.ZTUNNEL_APP_LABEL in slim_module.LABELS


def test_the_pod_service_keeps_what_its_settings_read(tmp_path: Path) -> None:
    team = LabelSelector(matchLabels=(("team.example/mesh", "yes"),))
    settings = Settings(
        cniAgentRunDir=str(tmp_path),
        ambient=AmbientSettings(enablementSelectors=(EnablementSelector(podSelector=team),)),
    )
    clients: Any = SimpleNamespace(core=None)  # no API call here
    service = PodService(settings, "node-1", lambda: clients, lambda: True)
    pod = full_pod(dict(pods())["basic"]) | {
        "metadata": {"name": "a", "namespace": "b", "labels": {"team.example/mesh": "yes"}}
    }
    service.pods.apply_event({"type": "ADDED", "object": pod}, "1")
    cached = service.pods.cached("b", "a")
    assert cached is not None and cached["metadata"]["labels"] == {"team.example/mesh": "yes"}


def test_ztunnel_gets_the_service_account_of_the_cached_pod() -> None:
    """ambient hands the pod to ztunnel as its namespace and service account (its workload,
    its certificate): the record keeps spec.serviceAccountName."""
    manifest = copy.deepcopy(dict(pods())["basic"])
    manifest["spec"]["serviceAccountName"] = "payments"
    record = PodCache(core=None, node_name="node-1")._as_obj(full_pod(manifest))
    assert ambient_pod(record, "").service_account == "payments"
