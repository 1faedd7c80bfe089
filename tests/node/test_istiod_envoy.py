"""Meshed pods that reach istiod through real Services, with the real Envoy: on a node with
Services (testbed/services.py), istiod serves its secure gRPC port to pods at
`istiod.istio-system.svc:15012` and signs with the test bed CA (testbed/istiod.py, `for_pods`);
its webhook injects pods whose istio-proxy is the `proxy-envoy` image, Istio's pilot-agent
running upstream Envoy 1.40 (testbed/istio_sidecar.py). Upstream Envoy has none of Istio's own
extensions, so istiod runs with the three that it adds to every sidecar off: Istio's telemetry
(`istio.stats`, type `stats.PluginConfig`), metadata exchange (`istio.metadata_exchange`, types
`envoy.tcp.metadataexchange.config.MetadataExchange` and `io.istio.http.peer_metadata.Config`) and
the ALPN filter (`istio.alpn`, `istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`); with
any of them on, Envoy rejects istiod's clusters or listeners naming it, and the pod never turns
Ready. What those extensions do (peer metadata in telemetry, ALPN for protocol sniffing to
HTTP services) is not exercised here.

What each test shows of a pod:
- pilot-agent got its workload certificate from istiod, naming the pod's own (non-default)
  service account in its SPIFFE ID and chaining to the `istio-ca-root-cert` root;
- Envoy took istiod's clusters and listeners (CDS and LDS accepted, none rejected) and the pod
  turned Ready through pilot-agent's readiness, which waits for exactly that;
- two such pods talk mutual TLS through their Envoys: TLS handshakes counted on the client's
  cluster and the server's inbound listener, each side's access log naming the other's SPIFFE ID;
- with DNS capture, the pod turns Ready and its app's lookup of a name only istiod's name table
  has (a ServiceEntry's) is answered through pilot-agent's DNS proxy on 15053, the pod's rule
  redirecting UDP 53 counted, the cluster DNS never asked.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed import images, istio_sidecar, kubepods, podnet
from testbed.injected import (
    PROXY,
    deployment,
    injected_namespace,
    sidecar_state,
    wait_deployment_pod,
)
from testbed.istiod import ROOT_CERT_CONFIGMAP, Istiod
from testbed.realnode import RealCluster
from testbed.wait import WaitTimeout
from tests.node.conftest import agent_on, istiod_running

pytestmark = [pytest.mark.node, pytest.mark.services, pytest.mark.istiod, pytest.mark.dataplane]

TRUST_DOMAIN = "cluster.local"
CLIENT_SA = "web-identity"
SERVER_SA = "echo-identity"
PORT = 8080
SERVICE_PORT = 80
# One line a connection, from every Envoy istiod configures: which peer each side saw.
ACCESS_LOG = (
    "mesh-leg cluster=%UPSTREAM_CLUSTER% peer_san=%DOWNSTREAM_PEER_URI_SAN% "
    "upstream_peer_san=%UPSTREAM_PEER_URI_SAN% downstream_tls=%DOWNSTREAM_TLS_VERSION%\n"
)
ACCESS_LOG_VALUES = {"meshConfig": {"accessLogFile": "/dev/stdout", "accessLogFormat": ACCESS_LOG}}
# Istio's telemetry off, and the two filters istiod adds for it and for protocol sniffing:
# Istio-only extensions upstream Envoy does not have.
ISTIO_ONLY_OFF = {
    "telemetry": {"enabled": False},
    "env": {"PILOT_ENABLE_METADATA_EXCHANGE": "false", "PILOT_ENABLE_ALPN_FILTER": "false"},
}
ISTIOD_VALUES = {**ACCESS_LOG_VALUES, **ISTIO_ONLY_OFF}
# A name only istiod's name table has: a ServiceEntry's host and address.
ENTRY_HOST = "db.mesh.test"
ENTRY_ADDRESS = "240.240.0.10"
RESOLVE_LOOP = """
import socket, sys, time
while True:
    try:
        print("resolve", sys.argv[1], socket.gethostbyname(sys.argv[1]), flush=True)
    except OSError as e:
        print("resolve", sys.argv[1], "error:", e, flush=True)
    time.sleep(1)
"""


@dataclass(frozen=True)
class Mesh:
    cluster: RealCluster
    core: Any
    istiod: Istiod
    namespace: str
    proxy_image: str
    """the `proxy-envoy` image's ref"""

    @property
    def workload(self) -> str:
        return self.cluster.images["workload"].ref

    def spiffe_id(self, service_account: str) -> str:
        return f"spiffe://{TRUST_DOMAIN}/ns/{self.namespace}/sa/{service_account}"

    def proxy_log(self, pod: Any) -> str:
        return kubepods.logs(self.core, self.namespace, pod.metadata.name, PROXY)

    def envoy_state(self, pod: Any) -> str:
        """What Envoy made of istiod's configuration, then the injected containers' logs."""
        netns = self.cluster.pod_netns(pod.metadata.uid)
        seen = istio_sidecar.describe(netns, self.proxy_log(pod))
        return f"{json.dumps(seen, indent=1)}\n{sidecar_state(self.core, self.namespace, pod)}"


@pytest.fixture(scope="module")
def mesh(services_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    cluster = services_cluster
    with contextlib.ExitStack() as stack:
        core = stack.enter_context(agent_on(cluster, tmp_path_factory, "proxy-envoy"))
        workdir = tmp_path_factory.mktemp("istiod")
        control = stack.enter_context(
            istiod_running(cluster, workdir, values=ISTIOD_VALUES, for_pods=True)
        )
        namespace = stack.enter_context(injected_namespace(core, cluster.apps(), control))
        for account in (CLIENT_SA, SERVER_SA):
            core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
        yield Mesh(cluster, core, control, namespace, images.image("proxy-envoy").ref)


def start(
    mesh: Mesh,
    name: str,
    command: list[str],
    service_account: str,
    metadata: dict[str, str] | None = None,
    *,
    argv: list[str] | None = None,
) -> Any:
    """A Deployment of one pod with the real Envoy as its sidecar, run as `service_account`,
    its app `app.py COMMAND` (or `argv` as written); the pod once the injector made it."""
    annotations = istio_sidecar.pod_annotations(mesh.proxy_image, metadata)
    manifest = deployment(name, mesh.workload, command, annotations)
    spec = manifest["spec"]["template"]["spec"]
    spec["serviceAccountName"] = service_account
    if argv is not None:
        spec["containers"][0]["command"] = argv
    mesh.cluster.apps().create_namespaced_deployment(mesh.namespace, manifest)
    return wait_deployment_pod(mesh.core, mesh.namespace, f"app={name}", mesh.istiod)


def wait_ready(mesh: Mesh, pod: Any) -> Any:
    """The pod Ready (pilot-agent's readiness: Envoy LIVE on istiod's first CDS and LDS), read
    back. Fails at once when Envoy rejects an update (pilot-agent holds readiness then), else
    on timeout; either failure carries Envoy's XDS counters and rejections."""
    name = pod.metadata.name

    def check() -> Any:
        if istio_sidecar.rejections(mesh.proxy_log(pod)):
            raise AssertionError(f"{name}: Envoy rejected istiod's configuration")
        view = kubepods.pod_view(mesh.core, mesh.namespace, name)
        return view if view is not None and view.phase == "Running" and view.ready else None

    try:
        kubepods.wait_for(check, f"{name} Ready", 150, interval=1.0)
    except (AssertionError, WaitTimeout) as e:
        raise AssertionError(f"{e}\n{mesh.envoy_state(pod)}") from None
    return mesh.core.read_namespaced_pod(name, mesh.namespace)


@pytest.fixture(scope="module")
def client_pod(mesh: Mesh) -> Any:
    """A pod run as CLIENT_SA that connects to the `echo` Service in a loop."""
    target = f"echo.{mesh.namespace}.svc.cluster.local"
    return start(mesh, "web", ["connect-loop", target, str(SERVICE_PORT), "1"], CLIENT_SA)


def test_pilot_agent_gets_the_workload_certificate_of_its_service_account(
    mesh: Mesh, client_pod: Any
) -> None:
    got = kubepods.wait_for(
        lambda: istio_sidecar.issued(mesh.cluster, client_pod.metadata.uid),
        f"{client_pod.metadata.name}: pilot-agent's workload certificate",
        120,
        on_timeout=lambda: sidecar_state(mesh.core, mesh.namespace, client_pod),
    )
    # The pod's own service account, not `default`: the SPIFFE ID is the token's, as istiod
    # checked it with the API server.
    assert istio_sidecar.uri_sans(got.chain) == [mesh.spiffe_id(CLIENT_SA)], got.chain
    cm = mesh.core.read_namespaced_config_map(ROOT_CERT_CONFIGMAP, mesh.namespace)
    root = cm.data["root-cert.pem"]
    ok, verdict = istio_sidecar.verify(got.chain, root)
    assert ok, verdict
    # The root pilot-agent gives Envoy for its peers is that same root.
    assert got.root.strip() == root.strip(), (got.root, root)
    # pilot-agent's own word for it, and the CA it asked: istiod at its Service.
    kubepods.wait_log_line(
        mesh.core, mesh.namespace, client_pod.metadata.name, PROXY,
        lambda s: "generated new workload certificate" in s, "pilot-agent's certificate",
    )  # fmt: skip
    log = mesh.proxy_log(client_pod)
    assert "CA Endpoint istiod.istio-system.svc:15012" in log, log[-4000:]


def test_envoy_takes_istiods_clusters_and_listeners_and_the_pod_turns_ready(
    mesh: Mesh, client_pod: Any
) -> None:
    pod = wait_ready(mesh, client_pod)
    netns = mesh.cluster.pod_netns(pod.metadata.uid)
    counters = istio_sidecar.xds_stats(netns)
    rejected = istio_sidecar.rejections(mesh.proxy_log(pod))
    assert counters["cluster_manager.cds.update_success"] > 0, (counters, rejected)
    assert counters["listener_manager.lds.update_success"] > 0, (counters, rejected)
    assert counters["cluster_manager.cds.update_rejected"] == 0, (counters, rejected)
    assert counters["listener_manager.lds.update_rejected"] == 0, (counters, rejected)
    assert rejected == [], rejected
    # Envoy asked pilot-agent for the certificate over SDS: its own record names the pod's
    # service account.
    status, body = istio_sidecar.admin(netns, "/certs")
    assert status == 200, body[:500]
    assert f'"uri": "{mesh.spiffe_id(CLIENT_SA)}"' in body, body[:3000]


def test_two_meshed_pods_talk_mutual_tls(mesh: Mesh, client_pod: Any) -> None:
    mesh.core.create_namespaced_service(
        mesh.namespace,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "selector": {"app": "echo"},
                # `tcp`: the server speaks first, so no protocol sniffing on this port.
                "ports": [{"name": "tcp", "port": SERVICE_PORT, "targetPort": PORT}],
            },
        },
    )
    server = wait_ready(mesh, start(mesh, "echo", ["serve", str(PORT)], SERVER_SA))
    client = wait_ready(mesh, client_pod)
    target = f"echo.{mesh.namespace}.svc.cluster.local"
    cluster_name = f"outbound|{SERVICE_PORT}||{target}"

    # The client's Envoy: its leg to the Service's cluster over TLS, the server's ID verified.
    out = kubepods.wait_log_line(
        mesh.core, mesh.namespace, client.metadata.name, PROXY,
        lambda s: s.startswith(f"mesh-leg cluster={cluster_name}") and "_san=spiffe://" in s,
        "the client Envoy's outbound leg", timeout=90,
    )  # fmt: skip
    assert f" upstream_peer_san={mesh.spiffe_id(SERVER_SA)} " in out, out
    # The server's Envoy: the inbound leg, the client's ID from its certificate.
    inbound = kubepods.wait_log_line(
        mesh.core, mesh.namespace, server.metadata.name, PROXY,
        lambda s: s.startswith("mesh-leg cluster=inbound|") and " peer_san=spiffe://" in s,
        "the server Envoy's inbound leg", timeout=60,
    )  # fmt: skip
    assert f" peer_san={mesh.spiffe_id(CLIENT_SA)} " in inbound, inbound
    assert "downstream_tls=TLSv1.3" in inbound or "downstream_tls=TLSv1.2" in inbound, inbound
    # The app saw plain bytes: the server's Envoy terminated TLS.
    kubepods.wait_log_line(
        mesh.core, mesh.namespace, client.metadata.name, "app",
        lambda s: f"connect {target}:{SERVICE_PORT} app port={PORT} " in s,
        "the client app's answer from the server app",
    )  # fmt: skip

    client_tls = istio_sidecar.stats(
        mesh.cluster.pod_netns(client.metadata.uid), r"ssl\.handshake$"
    )
    # (Istio names the cluster's stats by its alt_stat_name, the cluster's name and a `;`.)
    to_echo = [v for k, v in client_tls.items() if k.startswith(f"cluster.{cluster_name}")]
    assert sum(to_echo) > 0, client_tls
    server_tls = istio_sidecar.stats(
        mesh.cluster.pod_netns(server.metadata.uid), r"ssl\.handshake$"
    )
    inbound_tls = {k: v for k, v in server_tls.items() if k.startswith("listener.")}
    assert sum(inbound_tls.values()) > 0, server_tls


def test_dns_capture_pod_turns_ready_and_the_proxy_answers_its_lookups(mesh: Mesh) -> None:
    custom = k8s.CustomObjectsApi(mesh.core.api_client)
    custom.create_namespaced_custom_object(
        "networking.istio.io", "v1", mesh.namespace, "serviceentries",
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "db"},
            "spec": {
                "hosts": [ENTRY_HOST],
                "addresses": [ENTRY_ADDRESS],
                "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
                "location": "MESH_EXTERNAL",
                "resolution": "NONE",
            },
        },
    )  # fmt: skip
    pod = start(
        mesh, "dns", [], CLIENT_SA, {"ISTIO_META_DNS_CAPTURE": "true"},
        argv=["/usr/bin/python3", "-c", RESOLVE_LOOP, ENTRY_HOST],
    )  # fmt: skip
    pod = wait_ready(mesh, pod)
    # Readiness held until pilot-agent had istiod's name table; then the app's lookup.
    resolved = kubepods.wait_log_line(
        mesh.core, mesh.namespace, pod.metadata.name, "app",
        lambda s: s.startswith(f"resolve {ENTRY_HOST} "), "the app's lookup",
    )  # fmt: skip
    assert resolved == f"resolve {ENTRY_HOST} {ENTRY_ADDRESS}", resolved
    # Through the pod's rule to 15053, counted; the cluster DNS never asked for the name.
    netns = mesh.cluster.pod_netns(pod.metadata.uid)
    nat = podnet.in_netns(
        netns, f"iptables-{podnet.iptables_in_use(netns)}-save", "-c", "-t", "nat"
    )
    redirects = [
        s for s in nat.splitlines() if "-p udp" in s and "--to-ports 15053" in s and "53" in s
    ]
    counted = [int(m.group(1)) for s in redirects if (m := re.match(r"\[(\d+):\d+\]", s))]
    assert counted and sum(counted) > 0, nat
    coredns = (mesh.cluster.log_dir / "coredns.log").read_text()
    assert f"IN {ENTRY_HOST}. " not in coredns, coredns[-3000:]
