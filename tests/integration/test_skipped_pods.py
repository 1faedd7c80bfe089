"""Pods the agent must leave alone: ADD succeeds and their netns holds no ISTIO chain in any
netfilter flavour (iptables legacy, iptables nft, nftables)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.integration.conftest import SIDECAR_CONTAINERS, MeshNode, rules_in

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.chart]

INJECTED = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}
CASES: dict[str, dict[str, Any]] = {
    "excluded-kube-system": {"namespace": "kube-system", "annotations": INJECTED},
    "excluded-configured-list": {"namespace": "no-mesh", "annotations": INJECTED},
    "inject-false": {
        "namespace": "default",
        "annotations": {**INJECTED, "sidecar.istio.io/inject": "false"},
    },
    "istio-init-present": {
        "namespace": "default",
        "annotations": INJECTED,
        "init_containers": [{"name": "istio-init", "image": "registry.invalid/proxyv2:1"}],
    },
}


@pytest.fixture(scope="session")
def no_mesh_namespace(kube_core: Any) -> Iterator[str]:
    """The namespace added to the chart's excludeNamespaces (see conftest.EXCLUDED); one for
    the session: a deleted namespace takes a while to go, and refuses new pods meanwhile."""
    try:
        kube_core.create_namespace({"metadata": {"name": "no-mesh"}})
    except ApiException as e:
        if e.status != 409:
            raise
    yield "no-mesh"
    kube_core.delete_namespace("no-mesh")


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_pod_gets_no_rules_and_add_succeeds(
    case: str, no_mesh_namespace: str, mesh_node: MeshNode
) -> None:
    options = dict(CASES[case])
    pod = mesh_node.pod(
        options.pop("namespace"), sidecar=False, containers=SIDECAR_CONTAINERS, **options
    )
    sandbox = mesh_node.sandbox(pod)

    result = mesh_node.cnitool("ADD", sandbox)

    assert result.ok, result.stderr
    assert result.json()["ips"], "ADD must return the chain's result (the bridge's IP)"
    assert "ISTIO" not in rules_in(sandbox)
