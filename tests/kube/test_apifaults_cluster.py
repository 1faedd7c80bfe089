"""The test bed's fault proxy (testbed/apifaults.py) in front of the real kube-apiserver: without a
fault it is transparent (a ServiceAccount's own token authenticates through it, a watch streams
events as they happen); each fault does on the wire what it says."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed.apifaults import ApiFaultProxy, Fault
from testbed.controlplane import ControlPlane
from testbed.identity import Identity, service_account_identity
from testbed.wait import wait_for

pytestmark = pytest.mark.cluster

READER = "fault-proxy-reader"


@pytest.fixture(scope="module")
def reader(
    kube_core: Any, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Identity]:
    """A ServiceAccount that may get, list and watch namespaces, nothing else."""
    rbac: Any = k8s.RbacAuthorizationV1Api(kube_core.api_client)
    kube_core.create_namespaced_service_account("default", {"metadata": {"name": READER}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": READER},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": READER},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER,
            },
            "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": "default"}],
        }
    )
    try:
        identity = service_account_identity(
            kube_core,
            namespace="default",
            service_account=READER,
            server=control_plane.server,
            ca_file=control_plane.ca_file,
            path=tmp_path_factory.mktemp("reader") / "kubeconfig",
        )
        direct = ssl.create_default_context(cafile=str(control_plane.ca_file))

        def granted() -> bool:
            conn = http.client.HTTPSConnection(
                control_plane.address, control_plane.port, timeout=5, context=direct
            )
            try:
                return get(conn, "/api/v1/namespaces", identity.token)[0] == 200
            finally:
                conn.close()

        wait_for(granted, "the reader's role in the API server's authorizer", timeout=30)
        yield identity
    finally:
        rbac.delete_cluster_role_binding(READER)
        rbac.delete_cluster_role(READER)
        kube_core.delete_namespaced_service_account(READER, "default")


@pytest.fixture
def proxy(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ApiFaultProxy]:
    assert control_plane.ca is not None
    with ApiFaultProxy(
        tmp_path / "proxy",
        control_plane.ca,
        (control_plane.address, control_plane.port),
        "127.0.0.1",
        (),
    ) as made:
        yield made


@contextlib.contextmanager
def connected(
    proxy: ApiFaultProxy, control_plane: ControlPlane, timeout: float = 5.0
) -> Iterator[Any]:
    """One connection to the proxy, closed whatever the test does with it."""
    tls = ssl.create_default_context(cafile=str(control_plane.ca_file))
    conn = http.client.HTTPSConnection(proxy.address, proxy.port, timeout=timeout, context=tls)
    try:
        yield conn
    finally:
        conn.close()


def get(conn: Any, path: str, token: str) -> tuple[int, dict[str, str], Any]:
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    return resp.status, dict(resp.getheaders()), json.loads(resp.read() or b"null")


def test_transparent_without_a_fault(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity, kube_core: Any
) -> None:
    with connected(proxy, control_plane) as conn:
        status, _, body = get(conn, "/api/v1/namespaces", reader.token)
        assert status == 200 and body["kind"] == "NamespaceList", body["message"]
        # The same connection again (keep-alive), as the caller: its RBAC, not the proxy's.
        status, _, body = get(conn, "/api/v1/namespaces/default/secrets", reader.token)
        assert status == 403 and READER in body["message"], body
        status, _, _ = get(conn, "/api/v1/namespaces", "not-a-token")
        assert status == 401
    assert [r.target for r in proxy.requests][:2] == [
        "/api/v1/namespaces",
        "/api/v1/namespaces/default/secrets",
    ]


def test_a_watch_streams_through(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity, kube_core: Any
) -> None:
    name = f"streamed-{uuid.uuid4().hex[:8]}"
    lines: list[dict[str, Any]] = []
    try:
        with connected(proxy, control_plane, timeout=20) as conn:
            # From the watch cache (resourceVersion 0), as the agent's caches watch: a watch
            # "from now" waits for this test bed's etcd (no progress notifications) and may
            # time out.
            conn.request(
                "GET",
                "/api/v1/namespaces?watch=true&resourceVersion=0&timeoutSeconds=15",
                headers={"Authorization": f"Bearer {reader.token}"},
            )
            resp = conn.getresponse()
            assert resp.status == 200

            def create_later() -> None:
                time.sleep(1)
                kube_core.create_namespace({"metadata": {"name": name}})

            creator = threading.Thread(target=create_later)
            creator.start()
            began = time.monotonic()
            while time.monotonic() - began < 15:
                line = resp.readline()
                if not line:
                    break
                if line.strip():
                    event = json.loads(line)
                    lines.append(event)
                    assert event["type"] in ("ADDED", "MODIFIED"), event["object"].get("message")
                    if event["object"]["metadata"]["name"] == name:
                        break
            creator.join()
    finally:
        kube_core.delete_namespace(name)
    assert any(e["object"]["metadata"]["name"] == name for e in lines), lines[-3:]


def test_a_status_fault_answers_with_retry_after(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity
) -> None:
    proxy.set_fault(Fault("status", code=429, retry_after=7))
    with connected(proxy, control_plane) as conn:
        status, headers, body = get(conn, "/api/v1/namespaces", reader.token)
        assert (status, headers.get("Retry-After"), body["reason"]) == (429, "7", "TooManyRequests")
        proxy.clear()
        status, _, _ = get(conn, "/api/v1/namespaces", reader.token)  # same connection
        assert status == 200


def test_a_reset_fault_resets_open_and_new_connections(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity
) -> None:
    with connected(proxy, control_plane) as conn:
        assert get(conn, "/api/v1/namespaces", reader.token)[0] == 200
        proxy.set_fault(Fault("reset"))
        with pytest.raises((ConnectionError, OSError)):
            get(conn, "/api/v1/namespaces", reader.token)
    with (
        connected(proxy, control_plane) as fresh,
        pytest.raises((ConnectionError, OSError, ssl.SSLError)),
    ):
        get(fresh, "/api/v1/namespaces", reader.token)


def test_silence_holds_until_the_callers_timeout(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity
) -> None:
    proxy.set_fault(Fault("silence"))
    began = time.monotonic()
    with (
        connected(proxy, control_plane, timeout=1.0) as conn,
        pytest.raises((socket.timeout, TimeoutError)),
    ):
        get(conn, "/api/v1/namespaces", reader.token)
    assert time.monotonic() - began >= 0.9
    proxy.clear()
    with connected(proxy, control_plane) as conn:
        assert get(conn, "/api/v1/namespaces", reader.token)[0] == 200


def test_gone_on_resume_answers_only_watches_from_a_version(
    proxy: ApiFaultProxy, control_plane: ControlPlane, reader: Identity
) -> None:
    proxy.set_fault(Fault("gone_on_resume"))
    with connected(proxy, control_plane) as conn:
        status, _, body = get(conn, "/api/v1/namespaces", reader.token)
        assert status == 200
        version = body["metadata"]["resourceVersion"]
        path = f"/api/v1/namespaces?watch=true&resourceVersion={version}&timeoutSeconds=1"
        status, _, body = get(conn, path, reader.token)
        assert (status, body["code"]) == (410, 410)
