"""The caches' slim records (agent.pods.slim): every reader of a cached pod decides on the slim
record as on the full object the API server sent, and the record is a fraction of its size."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.ambient.enrollment import should_enroll
from agent.errors import InvalidPodInputError
from agent.label_selectors import EnablementSelector, LabelSelector
from agent.pods.cache import PodCache
from agent.pods.namespaces import NamespaceCache
from agent.pods.slim import NAMESPACE, POD, slim
from agent.readiness.build import _own_netns_uid
from agent.repair.detect import is_running_with_addresses, pod_key, validation_failed
from agent.rules.sidecar.pod import capture_config_for_pod, decide, ipv6_for_pod

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
                    "annotations": {"sidecar.istio.io/status": "{}"},
                    "labels": {"istio.io/dataplane-mode": "ambient"},
                },
                "spec": {"containers": [proxy]},
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
    assert set(record["spec"]) == {"containers"}
    for container in record["spec"]["containers"]:
        assert set(container) <= {"name", "args", "env", "securityContext"}


def test_values_of_another_shape_are_kept_whole() -> None:
    odd = {"spec": {"containers": "not a list", "initContainers": [1, {"name": "x", "image": "i"}]}}
    kept = {"spec": {"containers": "not a list", "initContainers": [1, {"name": "x"}]}}
    assert slim(odd, POD) == kept


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
