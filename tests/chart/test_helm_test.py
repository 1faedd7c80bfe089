"""The chart's `helm test` hook (templates/test-capture.yaml): a pod the agent captures (the
injector's markers), in a namespace of its own that capture does not exclude, whose scripts are
valid Python; the node tier (tests/node/test_status.py) runs it both ways."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.helm import Helm
from tests.chart.conftest import only

pytestmark = pytest.mark.chart


def hooks(helm: Helm, sets: list[str] | None = None) -> list[dict[str, Any]]:
    docs = helm.render(sets=sets or [])
    return [
        d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]


def test_the_test_pod_carries_the_agents_markers(helm: Helm) -> None:
    docs = hooks(helm)
    assert sorted(d["kind"] for d in docs) == ["Namespace", "Pod"]
    pod, ns = only(docs, "Pod"), only(docs, "Namespace")
    assert pod["metadata"]["namespace"] == ns["metadata"]["name"] == "istio-cni-test"
    assert "sidecar.istio.io/status" in pod["metadata"]["annotations"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert containers["istio-proxy"]["securityContext"]["runAsUser"] == 1337
    assert containers["check"]["securityContext"]["runAsUser"] != 1337  # its traffic is captured
    env = {e["name"]: e.get("value") for e in containers["check"]["env"]}
    assert env["EXCLUDED_NAMESPACES"] == "istio-system,kube-system"
    for container in containers.values():
        command = container["command"]
        assert command[:2] == ["python3", "-c"]
        compile(command[2], container["name"], "exec")
    assert "helm.sh/hook-succeeded" not in str(pod["metadata"]["annotations"])
    assert "hook-succeeded" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]


def test_the_test_namespace_follows_the_values(helm: Helm) -> None:
    docs = hooks(helm, ["test.namespace=meshcheck", "test.connectTimeoutSeconds=5"])
    assert only(docs, "Namespace")["metadata"]["name"] == "meshcheck"
    check = only(docs, "Pod")["spec"]["containers"][1]
    assert {"name": "CONNECT_TIMEOUT", "value": "5"} in check["env"]
