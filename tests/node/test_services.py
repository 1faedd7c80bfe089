"""Services on the real node (testbed/services.py): pods reach ClusterIPs by name, through the
real kube-proxy's rules in the node netns and the real CoreDNS at kubelet's clusterDNS.

In one namespace: a plain server pod behind the `echo` Service (port 80 -> 8080), a pod that
resolves names in a loop, a plain client calling `echo` by its short name and the API server by
`kubernetes.default.svc.cluster.local`, and a meshed client (a real Envoy sidecar, the agent
installed) calling `echo` by its full name. Each test reads its own leg from the logs.

What the legs show: DNS answers with the ClusterIP; the server sees each connection from the
node's bridge address (kube-proxy's masqueradeAll), not from the client pod; a meshed client's
Envoy sees the ClusterIP as the original destination and connects to it (the DNAT to the pod
happens after, in the node netns)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed import envoy, kubepods, parts
from testbed.controlplane import SERVICE_CIDR, SERVICE_IP
from testbed.istiod import NAMESPACE
from testbed.realnode import RealCluster
from tests.node.conftest import agent_on, istiod_running

pytestmark = [pytest.mark.node, pytest.mark.services]

PORT = 8080
SERVICE_PORT = 80
API_NAME = "kubernetes.default.svc.cluster.local"
# Resolves each name every second through the pod's resolv.conf (kubelet's clusterDNS).
RESOLVE_LOOP = """
import socket, sys, time
while True:
    for name in sys.argv[1:]:
        try:
            print("resolve", name, socket.gethostbyname(name), flush=True)
        except OSError as e:
            print("resolve", name, "error:", e, flush=True)
    time.sleep(1)
"""
# GET /version (public) every second; the serving certificate is the test bed CA's, which the
# pod does not hold: the answer itself says who served it.
VERSION_LOOP = """
import json, ssl, sys, time, urllib.request
while True:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5,
                                    context=ssl._create_unverified_context()) as r:
            print("version", json.load(r)["gitVersion"], flush=True)
    except OSError as e:
        print("version error:", e, flush=True)
    time.sleep(1)
"""
# A TLS handshake with istiod's secure gRPC port at its Service, checked as pilot-agent checks
# it: the certificate chains to istiod's CA (argv[3], PEM) and names the Service; HTTP/2 by ALPN.
ISTIOD_LOOP = """
import socket, ssl, sys, time
context = ssl.create_default_context(cadata=sys.argv[3])
context.set_alpn_protocols(["h2"])
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=sys.argv[1]) as tls:
                print("tls", sys.argv[1], "ok", tls.selected_alpn_protocol(), flush=True)
    except OSError as e:
        print("tls", sys.argv[1], "error:", e, flush=True)
    time.sleep(1)
"""


@dataclass(frozen=True)
class Bed:
    cluster: RealCluster
    core: Any
    namespace: str
    ips: dict[str, str]
    """pod name -> its IP"""
    cluster_ip: str
    """the `echo` Service's"""

    @property
    def echo_name(self) -> str:
        return f"echo.{self.namespace}.svc.cluster.local"

    @property
    def bridge_ip(self) -> str:
        """The node's address on the pod bridge (the bridge plugin's gateway)."""
        return str(ipaddress.ip_network(self.cluster.pod_subnet).network_address + 1)


@pytest.fixture(scope="module")
def bed(services_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    cluster = services_cluster
    with (
        agent_on(cluster, tmp_path_factory, "envoy") as core,
        kubepods.pod_namespace(core, "svc") as namespace,
    ):
        yield start_pods(cluster, core, namespace)


def start_pods(cluster: RealCluster, core: Any, namespace: str) -> Bed:
    workload = cluster.images["workload"].ref
    server = kubepods.pod_manifest(
        "echo-server", workload, app_command=["serve", str(PORT)], sidecar=False,
        labels={"app": "echo"},
    )  # fmt: skip
    core.create_namespaced_pod(namespace, server)
    service = core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "selector": {"app": "echo"},
                "ports": [{"name": "tcp", "port": SERVICE_PORT, "targetPort": PORT}],
            },
        },
    )
    echo_name = f"echo.{namespace}.svc.cluster.local"
    resolver = kubepods.pod_manifest("resolver", workload, app_command=[], sidecar=False)
    resolver["spec"]["containers"][0]["command"] = [
        "/usr/bin/python3", "-c", RESOLVE_LOOP, API_NAME, echo_name, "echo",
    ]  # fmt: skip
    core.create_namespaced_pod(namespace, resolver)
    plain = kubepods.pod_manifest(
        "plain-client", workload, app_command=["connect-loop", "echo", str(SERVICE_PORT), "1"],
        sidecar=False,
    )  # fmt: skip
    plain["spec"]["containers"].append(
        kubepods.container(
            "to-api",
            workload,
            ["/usr/bin/python3", "-c", VERSION_LOOP, f"https://{API_NAME}/version"],
        )
    )
    core.create_namespaced_pod(namespace, plain)
    meshed = kubepods.pod_manifest(
        "mesh-client", workload, app_command=["connect-loop", echo_name, str(SERVICE_PORT), "1"],
        sidecar=True, proxy_image=cluster.images["envoy"].ref,
    )  # fmt: skip
    core.create_namespaced_pod(namespace, meshed)
    ips = {}
    for name in ("echo-server", "resolver", "plain-client", "mesh-client"):
        view = kubepods.wait_running(core, namespace, name)
        assert view.ip, view
        ips[name] = view.ip
    return Bed(cluster, core, namespace, ips, service.spec.cluster_ip)


def wait_line(bed: Bed, pod: str, container: str, text: str) -> str:
    return kubepods.wait_log_line(
        bed.core, bed.namespace, pod, container, lambda s: text in s, f"'{text}'"
    )


def test_the_service_gets_a_cluster_ip_of_the_service_cidr(bed: Bed) -> None:
    assert ipaddress.ip_address(bed.cluster_ip) in ipaddress.ip_network(SERVICE_CIDR), bed


def test_cluster_dns_answers_service_names_with_their_cluster_ips(bed: Bed) -> None:
    wait_line(bed, "resolver", "app", f"resolve {API_NAME} {SERVICE_IP}")
    wait_line(bed, "resolver", "app", f"resolve {bed.echo_name} {bed.cluster_ip}")
    # The short name, through the search path kubelet wrote into the pod's resolv.conf.
    wait_line(bed, "resolver", "app", f"resolve echo {bed.cluster_ip}")
    # CoreDNS got the query from the pod itself: kube-proxy's DNAT to the node's address.
    coredns_log = (bed.cluster.log_dir / "coredns.log").read_text()
    query = f'"A IN {API_NAME}. udp'
    assert any(
        line.startswith(f"[INFO] {bed.ips['resolver']}:") and query in line
        for line in coredns_log.splitlines()
    ), coredns_log[-3000:]


def test_plain_pod_reaches_the_pod_behind_a_cluster_ip(bed: Bed) -> None:
    line = wait_line(bed, "plain-client", "app", f"connect echo:{SERVICE_PORT} app port={PORT} ")
    # The server saw the connection from the node's bridge address: it went through the node
    # netns, DNAT'ed to the server pod and masqueraded there.
    assert f"peer={bed.bridge_ip}:" in line and "echo=hello" in line, line
    wait_line(bed, "echo-server", "app", f"app port={PORT} peer={bed.bridge_ip}:")


def test_plain_pod_reaches_the_api_server_at_the_kubernetes_service(bed: Bed) -> None:
    # The test bed's API server answers: its release, as it reports it to the test.
    wait_line(bed, "plain-client", "to-api", f"version {parts.kube_version()}")


def test_meshed_pod_reaches_the_service_through_its_envoy(bed: Bed) -> None:
    client = bed.ips["mesh-client"]
    line = wait_line(
        bed, "mesh-client", "app", f"connect {bed.echo_name}:{SERVICE_PORT} app port={PORT} "
    )
    assert f"peer={bed.bridge_ip}:" in line, line

    def legs() -> list[dict[str, str]]:
        text = kubepods.logs(bed.core, bed.namespace, "mesh-client", "istio-proxy")
        return [
            entry
            for entry in (json.loads(s) for s in text.splitlines() if s.startswith("{"))
            if entry["listener"] == envoy.OUTBOUND_LISTENER
            and entry["downstream_remote"].startswith(f"{client}:")
        ]

    # The app connects every second from its start, so its first tries may precede the
    # Service's endpoints in kube-proxy's rules (Envoy logs them UF,URX); the app's line above
    # is a try that got through, and Envoy logged it as a clean pass-through.
    out = kubepods.wait_for(
        lambda: next((e for e in legs() if e["flags"] == "-"), None),
        "the client Envoy's outbound leg that connected",
        60,
        interval=0.5,
    )
    # Envoy sees the ClusterIP as the original destination and connects to it itself: the
    # DNAT to the server pod is the node's, after the connection left the pod.
    assert out["cluster"] == envoy.PASSTHROUGH, out
    assert out["upstream_host"] == f"{bed.cluster_ip}:{SERVICE_PORT}", out
    for entry in legs():  # every try, the failed ones too, was captured with its destination
        assert entry["downstream_local"] == f"{bed.cluster_ip}:{SERVICE_PORT}", entry


def test_pod_reaches_istiod_at_its_service(bed: Bed, tmp_path: Path) -> None:
    """What pilot-agent in a meshed pod needs for its certificate: istiod's 15012 by the
    Service's name, and a TLS handshake that verifies."""
    with istiod_running(bed.cluster, tmp_path, for_pods=True) as control:
        assert control.ca is not None
        name = f"istiod.{NAMESPACE}.svc"
        pod = kubepods.pod_manifest("to-istiod", bed.cluster.images["workload"].ref,
                                    app_command=[], sidecar=False)  # fmt: skip
        pod["spec"]["containers"][0]["command"] = [
            "/usr/bin/python3", "-c", ISTIOD_LOOP, name, "15012", control.ca.cert.read_text(),
        ]  # fmt: skip
        bed.core.create_namespaced_pod(bed.namespace, pod)
        try:
            kubepods.wait_running(bed.core, bed.namespace, "to-istiod")
            wait_line(bed, "to-istiod", "app", f"tls {name} ok h2")
        finally:
            bed.core.delete_namespaced_pod("to-istiod", bed.namespace, grace_period_seconds=0)
