"""PodService end to end on the test bed: the real API server feeds the cache, the plugin's
requests arrive on the real Unix socket, and the real decision table chooses. Applying rules
is recorded here (the rule backends have their own netns tests)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.config import Settings
from agent.kube import build_clients
from agent.podserver.metrics import PluginMetrics
from agent.podserver.service import PodService
from plugin import wire
from testbed.node import NodePods
from testbed.wait import wait_for
from tests.podserver.helpers import RealDecisions, call

pytestmark = pytest.mark.cluster

SIDECAR = {
    "containers": [
        {"name": "app", "image": "registry.invalid/app:1"},
        {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
    ],
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
}


class Service:
    def __init__(
        self,
        service: PodService,
        redirector: RealDecisions,
        socket_path: str,
        installed: list[bool],
    ) -> None:
        self.service = service
        self.redirector = redirector
        self.socket = socket_path
        self.installed = installed

    def wait_ready(self) -> None:
        # ready() is the socket listening (/readyz); the plugin's STATUS also waits for the cache.
        wait_for(
            lambda: self.service.ready() and self.service.not_ready_reason() is None,
            "the pod service to be ready",
            30,
            interval=0.05,
            on_timeout=lambda: f"not ready because: {self.service.not_ready_reason()}",
        )


@pytest.fixture
def pod_service(sim_node: str, tmp_path: Path) -> Iterator[Service]:
    run_dir = Path("/tmp") / f"podsvc-{os.getpid()}-{tmp_path.name[-12:]}"
    settings = Settings(cniAgentRunDir=str(run_dir))
    installed = [False]
    redirector = RealDecisions(exclude=settings.excludeNamespaces)
    service = PodService(
        settings,
        sim_node,
        build_clients,
        lambda: installed[0],
        redirector=redirector,
        metrics=PluginMetrics(CollectorRegistry()),
    )
    service.start()
    try:
        yield Service(service, redirector, settings.socket_path, installed)
    finally:
        service.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def namespace(random_namespace_function_scope: Any) -> str:
    return str(random_namespace_function_scope.name)


def test_status_waits_for_install_and_cache(pod_service: Service) -> None:
    status, body = call(pod_service.socket, "GET", wire.PATH_STATUS)
    assert (status, body["ready"]) == (503, False)
    assert "not installed" in body["reason"]
    pod_service.installed[0] = True
    pod_service.wait_ready()
    assert call(pod_service.socket, "GET", wire.PATH_STATUS) == (200, {"ready": True})


def test_add_of_api_pods(pod_service: Service, node_pods: NodePods, namespace: str) -> None:
    sidecar = node_pods.create(namespace, "with-sidecar", **SIDECAR)
    node_pods.create(namespace, "plain")
    add = wire.encode(
        wire.cni_request(
            command="ADD",
            container_id="sandbox-1",
            netns="/var/run/netns/x",
            ifname="eth0",
            pod_name="with-sidecar",
            pod_namespace=namespace,
            pod_uid=sidecar["metadata"]["uid"],
            cni_version="1.0.0",
            prev_result=None,
        )
    )
    status, body = call(pod_service.socket, "POST", wire.PATH_ADD, add)
    assert (status, body["result"]) == (200, "redirected")
    assert pod_service.redirector.applied == [("/var/run/netns/x", "with-sidecar")]
    plain = add.replace(b'"with-sidecar"', b'"plain"').replace(
        sidecar["metadata"]["uid"].encode(), b""
    )
    status, body = call(pod_service.socket, "POST", wire.PATH_ADD, plain)
    assert (status, body["result"]) == (200, "skipped")
    assert "no istio-proxy container" in body["reason"]


def test_add_of_unknown_pod_asks_to_retry(pod_service: Service, namespace: str) -> None:
    add = wire.encode(
        wire.cni_request(
            command="ADD",
            container_id="sandbox-2",
            netns="/var/run/netns/x",
            ifname="eth0",
            pod_name="ghost",
            pod_namespace=namespace,
            pod_uid="",
            cni_version="1.0.0",
            prev_result=None,
        )
    )
    status, body = call(pod_service.socket, "POST", wire.PATH_ADD, add)
    assert status == 503
    assert body["code"] == 11
    assert f"{namespace}/ghost" in body["msg"]
    assert pod_service.redirector.applied == []


def test_stop_removes_the_socket(sim_node: str, tmp_path: Path) -> None:
    run_dir = Path("/tmp") / f"podsvc-{os.getpid()}-stop"
    settings = Settings(cniAgentRunDir=str(run_dir))
    service = PodService(
        settings,
        sim_node,
        build_clients,
        lambda: True,
        redirector=RealDecisions(),
        metrics=PluginMetrics(CollectorRegistry()),
    )
    try:
        service.start()
        assert os.path.exists(settings.socket_path)
        service.stop()
        assert not os.path.exists(settings.socket_path)
        assert not service.ready()
        service.stop()  # idempotent
    finally:
        service.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
