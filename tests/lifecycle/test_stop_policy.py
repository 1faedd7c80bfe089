"""Uninstall or keep on SIGTERM, decided from the DaemonSet's state."""

from __future__ import annotations

import pathlib
import socket
from typing import Any

import pytest

from agent.install.stop_policy import ClusterState, decide, decide_from_cluster, node_matches

NODE = {
    "metadata": {"name": "node-1", "labels": {"kubernetes.io/os": "linux", "pool": "a", "gen": "5"}}
}


def _ds(spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "istio-cni-node", **metadata},
        "spec": {"template": {"spec": spec or {}}},
    }


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
            }
        }
    }


@pytest.mark.parametrize(
    ("mode", "state", "uninstall"),
    [
        ("auto", ClusterState(daemonset=None, node=NODE), True),
        (
            "auto",
            ClusterState(daemonset=_ds(deletionTimestamp="2026-01-01T00:00:00Z"), node=NODE),
            True,
        ),
        ("auto", ClusterState(daemonset=_ds({"nodeSelector": {"pool": "b"}}), node=NODE), True),
        ("auto", ClusterState(daemonset=_ds({"nodeSelector": {"pool": "a"}}), node=NODE), False),
        ("auto", ClusterState(daemonset=_ds(), node=None), False),
        ("auto", ClusterState(error="connection refused"), False),
        ("auto", None, False),
        ("always", ClusterState(daemonset=_ds(), node=NODE), True),
        ("always", None, True),
        ("never", ClusterState(daemonset=None), False),
    ],
    ids=[
        "ds-gone",
        "ds-deleting",
        "node-unselected",
        "upgrade",
        "node-unknown",
        "api-unreachable",
        "no-pod",
        "forced-always",
        "forced-always-no-api",
        "forced-never",
    ],
)
def test_decide(mode: str, state: ClusterState | None, uninstall: bool) -> None:
    decision = decide(mode, state)
    assert decision.uninstall is uninstall
    assert decision.reason


@pytest.mark.parametrize(
    ("spec", "matches"),
    [
        ({}, True),
        ({"nodeSelector": {"kubernetes.io/os": "linux"}}, True),
        ({"nodeSelector": {"kubernetes.io/os": "windows"}}, False),
        (
            _affinity({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}),
            True,
        ),
        (
            _affinity(
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}
            ),
            False,
        ),
        (
            _affinity(
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]},
                {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]},
            ),
            True,
        ),
        (
            _affinity({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}),
            False,
        ),
        (_affinity({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}), True),
        (_affinity({"matchExpressions": [{"key": "x", "operator": "Exists"}]}), False),
        (
            _affinity(
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
            ),
            True,
        ),
        (
            _affinity(
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
            ),
            False,
        ),
        (_affinity({}), False),
    ],
)
def test_node_matches(spec: dict[str, Any], matches: bool) -> None:
    assert node_matches(_ds(spec), NODE) is matches


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_unreachable_api_server_means_keep(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real client against a loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the test asks it
    (tmp_path / "kubeconfig").write_text(KUBECONFIG % port)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    decision = decide_from_cluster("auto", pod_name="p", pod_namespace="ns", node_name="n")
    assert decision.uninstall is False and "unreachable" in decision.reason


def test_no_client_config_means_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    decision = decide_from_cluster("auto", pod_name="p", pod_namespace="ns", node_name="n")
    assert decision.uninstall is False
    assert decide_from_cluster("always", pod_name="", pod_namespace="", node_name="").uninstall
