"""Ambient mode with the real istiod: Istio's `base` and `istiod` charts with `profile=ambient`
(PILOT_ENABLE_AMBIENT), this chart with `profile=ambient` (the ztunnel TEST DOUBLE of
testbed/ztunnel_double.py on its ZDS socket: ztunnel cannot run here). A pod that kubelet starts
in a namespace labelled `istio.io/dataplane-mode=ambient` is enrolled by the agent, which writes
`ambient.istio.io/redirection: enabled` on it; istiod, reading that annotation as Istio's own
agent writes it, then serves the pod to ztunnel as an HBONE workload (its `/debug/ambientz`,
the workloads it would send over WDS). A pod of a plain namespace is served without a tunnel.
Releasing the pod (the label removed) takes the annotation away and istiod follows. A module of
its own: its istiod runs with other values than tests/node/test_istiod.py's."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods
from testbed.images import Image
from testbed.istiod import Istiod
from testbed.realnode import RealCluster
from testbed.ztunnel_double import ZtunnelDouble, api_identity
from tests.node.conftest import istiod_running

pytestmark = [pytest.mark.node, pytest.mark.istiod]

MODE_LABEL = "istio.io/dataplane-mode"
ANNOTATION = "ambient.istio.io/redirection"
AMBIENT = {"profile": "ambient"}


@pytest.fixture(scope="module")
def ambient_istiod(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Istiod]:
    workdir = tmp_path_factory.mktemp("istiod-ambient")
    with istiod_running(real_cluster, workdir, values=AMBIENT, base_values=AMBIENT) as control:
        yield control


@pytest.fixture
def plain_ns(node_core: Any) -> Iterator[str]:
    with kubepods.pod_namespace(node_core, "plain") as name:
        yield name


def served_workload(istiod: Istiod, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod as istiod would serve it to ztunnel (from its /debug/ambientz), or None."""
    conn = http.client.HTTPConnection("127.0.0.1", istiod.ports.http, timeout=5)
    try:
        conn.request("GET", "/debug/ambientz")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, (response.status, body[:500])
    for workload in json.loads(body).get("workloads") or []:
        if (workload.get("namespace"), workload.get("name")) == (namespace, name):
            found: dict[str, Any] = workload
            return found
    return None


def tunnel(istiod: Istiod, namespace: str, name: str) -> str | None:
    """The tunnel istiod gives the pod's workload ("NONE" when it has none), None while it has
    no workload for it."""
    workload = served_workload(istiod, namespace, name)
    return None if workload is None else str(workload.get("tunnelProtocol") or "NONE")


def annotation(core: Any, namespace: str, name: str) -> str | None:
    value: str | None = (core.read_namespaced_pod(name, namespace).metadata.annotations or {}).get(
        ANNOTATION
    )
    return value


def test_istiod_serves_the_pods_the_agent_enrolls_over_hbone(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    ambient_istiod: Istiod,
    workload_ns: str,
    plain_ns: str,
) -> None:
    istiod = ambient_istiod
    node_core.patch_namespace(workload_ns, {"metadata": {"labels": {MODE_LABEL: "ambient"}}})
    agent_mod.install(
        node_helm("4"),
        real_cluster,
        node_core,
        agent_image,
        profile="ambient",
        ambient={"ztunnelSocketPath": str(ztunnel_socket)},
    )
    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(node_core)) as ztunnel:
        ztunnel.connect()
        image = real_cluster.images["workload"].ref
        for ns in (workload_ns, plain_ns):
            manifest = kubepods.pod_manifest("web", image, app_command=["sleep"], sidecar=False)
            node_core.create_namespaced_pod(ns, manifest)
        meshed = kubepods.wait_running(node_core, workload_ns, "web")
        kubepods.wait_running(node_core, plain_ns, "web")
        assert annotation(node_core, workload_ns, "web") == "enabled"
        assert meshed.uid in ztunnel.workloads(), ztunnel.requests

        kubepods.wait_for(
            lambda: tunnel(istiod, workload_ns, "web") == "HBONE",
            "istiod to serve the enrolled pod over HBONE",
            60,
            on_timeout=lambda: (
                f"{served_workload(istiod, workload_ns, 'web')}\n" + istiod.log()[-3000:]
            ),
        )
        served = served_workload(istiod, workload_ns, "web")
        assert served is not None, served
        assert served.get("uid") == f"Kubernetes//Pod/{workload_ns}/web", (
            served
        )  # cluster ID Kubernetes
        kubepods.wait_for(
            lambda: tunnel(istiod, plain_ns, "web"), "istiod's workload of the plain pod", 60
        )
        assert tunnel(istiod, plain_ns, "web") == "NONE"

        # Released: the agent takes its annotation away and istiod serves it without a tunnel.
        node_core.patch_namespace(workload_ns, {"metadata": {"labels": {MODE_LABEL: None}}})
        kubepods.wait_for(
            lambda: annotation(node_core, workload_ns, "web") is None, "the pod released", 30
        )
        kubepods.wait_for(
            lambda: tunnel(istiod, workload_ns, "web") == "NONE",
            "istiod to serve the released pod without a tunnel",
            60,
        )
