"""Services on a real node (testbed/realnode.py): the real kube-proxy and the real CoreDNS, run
as processes of the node in its network namespace, the way kubelet runs there.

    NodeServices.start():
      `kubernetes` EndpointSlice   the API server's address and port (the API server runs with
                                   --endpoint-reconciler-type=none, so nobody else writes it)
      kube-proxy                   iptables mode, as user system:kube-proxy (the API server's own
                                   system:node-proxier binding); ready once /healthz says so
      CoreDNS                      on the node's IP, port 53, its `kubernetes` plugin as user
                                   system:coredns (the ClusterRole CoreDNS's own manifests grant);
                                   the `kube-dns` Service at CLUSTER_DNS (kubelet's clusterDNS)
                                   with an EndpointSlice naming the node's IP; ready once /ready
    NodeServices.stop(): both processes; their iptables chains stay in the node netns, deleted
    with it, and the API objects go with the control plane.

CoreDNS is a node process, not a pod: it reaches the API server straight over the node's link
(as a pod it would need the `kubernetes` Service's rules in place first), and no image of the
test bed need hold it. Pods see the same either way: the `kube-dns` Service, a ClusterIP that
kube-proxy DNATs to an endpoint.

masqueradeAll: pods' connections to a ClusterIP leave with the node's address (a pod behind a
Service sees the node's bridge address as the peer). The API server (and istiod) listen in the
machine's root namespace, which has no route back to the node's pod subnet; the node's own
address is on the link it reaches.
"""

from __future__ import annotations

import contextlib
import http.client
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from testbed import parts, pki
from testbed.controlplane import ControlPlane
from testbed.kubeconfig import write_kubeconfig
from testbed.process import Daemon
from testbed.wait import wait_for

CLUSTER_DNS = "10.96.0.10"
"""kube-dns's ClusterIP, in the API server's --service-cluster-ip-range (SERVICE_CIDR)."""
CLUSTER_DOMAIN = "cluster.local"
DNS_NAMESPACE = "kube-system"
KUBE_PROXY_HEALTHZ_PORT = 10256
COREDNS_READY_PORT = 8181
READY_TIMEOUT = 60.0
COREDNS_USER = "system:coredns"
# What CoreDNS's own manifests grant it (coredns/deployment: kubernetes/coredns.yaml.sed).
COREDNS_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
     "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["list", "watch"]},
]  # fmt: skip


def kube_proxy_configuration(
    *, kubeconfig: Path, node_name: str, node_ip: str, cluster_cidr: str
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": node_ip,
        "healthzBindAddress": f"{node_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "nodePortAddresses": ["primary"],  # the node's IP, not every address of its netns
        # No route_localnet games: no NodePort on the node's loopback.
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "minSyncPeriod": "0s"},
        # Zero leaves each conntrack sysctl as it is: most are the machine's, not the netns's.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def corefile(*, node_ip: str, kubeconfig: Path, context: str) -> str:
    """Cluster names only (no `forward`: nothing outside the cluster is reachable); `log` puts
    every query in CoreDNS's log, with the address it came from."""
    return f""".:53 {{
    bind {node_ip}
    errors
    log
    ready {node_ip}:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} {context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""


class NodeServices:
    """start() once the node is Ready; stop() (idempotent)."""

    def __init__(
        self,
        workdir: Path,
        log_dir: Path,
        *,
        prefix: list[str],
        plane: ControlPlane,
        node_name: str,
        node_ip: str,
        pod_subnet: str,
    ) -> None:
        """`prefix`: the command prefix that runs a program in the node netns."""
        self.kube_proxy_binary = parts.kube_proxy().require()
        self.coredns_binary = parts.coredns().require()
        self.workdir = workdir
        self.log_dir = log_dir
        self.prefix = prefix
        self.plane = plane
        self.node_name = node_name
        self.node_ip = node_ip
        self.pod_subnet = pod_subnet
        self.kube_proxy: Daemon | None = None
        self.coredns: Daemon | None = None

    @property
    def daemons(self) -> list[Daemon]:
        return [d for d in (self.kube_proxy, self.coredns) if d is not None]

    def start(self, api: Any) -> None:
        """`api`: an ApiClient as cluster admin."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Manifests as dicts, as the client's serializer takes them.
        core: Any = k8s.CoreV1Api(api)
        discovery: Any = k8s.DiscoveryV1Api(api)
        rbac: Any = k8s.RbacAuthorizationV1Api(api)
        put_endpoint_slice(
            discovery, "default", "kubernetes", "kubernetes", self.plane.address,
            [("https", self.plane.port, "TCP")],
        )  # fmt: skip
        self._start_kube_proxy()
        rbac.create_cluster_role({"metadata": {"name": COREDNS_USER}, "rules": COREDNS_RULES})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": COREDNS_USER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": COREDNS_USER,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}
                ],
            }
        )
        self._start_coredns()
        ports = [("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]
        core.create_namespaced_service(
            DNS_NAMESPACE,
            {
                "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": CLUSTER_DNS,
                    "ports": [{"name": n, "port": p, "protocol": t} for n, p, t in ports],
                },
            },
        )
        put_endpoint_slice(
            discovery, DNS_NAMESPACE, "kube-dns-node", "kube-dns", self.node_ip, ports
        )

    def _kubeconfig(self, user: str, stem: str) -> Path:
        assert self.plane.ca is not None
        cert = pki.issue(self.plane.ca, self.workdir, stem, common_name=user)
        return write_kubeconfig(
            self.workdir / f"{stem}.kubeconfig",
            server=self.plane.server,
            ca_file=self.plane.ca.cert,
            user=user,
            client_cert=cert.cert,
            client_key=cert.key,
        )

    def _start_kube_proxy(self) -> None:
        config = self.workdir / "kube-proxy.yaml"
        settings = kube_proxy_configuration(
            kubeconfig=self._kubeconfig("system:kube-proxy", "kube-proxy"),
            node_name=self.node_name,
            node_ip=self.node_ip,
            cluster_cidr=self.pod_subnet,
        )
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        self.kube_proxy = Daemon(
            "kube-proxy",
            [*self.prefix, str(self.kube_proxy_binary), f"--config={config}", "--v=2"],
            self.log_dir / "kube-proxy.log",
        )
        self.kube_proxy.start()
        _wait_http(self.kube_proxy, self.node_ip, KUBE_PROXY_HEALTHZ_PORT, "/healthz")

    def _start_coredns(self) -> None:
        config = self.workdir / "Corefile"
        kubeconfig = self._kubeconfig(COREDNS_USER, "coredns")
        config.write_text(
            corefile(node_ip=self.node_ip, kubeconfig=kubeconfig, context=COREDNS_USER)
        )
        self.coredns = Daemon(
            "coredns",
            [*self.prefix, str(self.coredns_binary), "-conf", str(config)],
            self.log_dir / "coredns.log",
            cwd=self.workdir,
        )
        self.coredns.start()
        _wait_http(self.coredns, self.node_ip, COREDNS_READY_PORT, "/ready")

    def stop(self) -> None:
        for daemon in (self.coredns, self.kube_proxy):
            if daemon is not None:
                daemon.stop()


def put_endpoint_slice(
    discovery: Any,
    namespace: str,
    name: str,
    service: str,
    address: str,
    ports: list[tuple[str, int, str]],
) -> None:
    """An EndpointSlice of `service` with one ready endpoint, as a controller would write it."""
    discovery.create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "testbed",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": n, "port": p, "protocol": t} for n, p, t in ports],
        },
    )


def _wait_http(daemon: Daemon, host: str, port: int, path: str) -> None:
    """Until GET `path` answers 200 (the node's IP is on the link the test bed's process
    reaches); fails naming the part if it exits first."""

    def ready() -> bool:
        if not daemon.alive():
            raise daemon.failure("exited before it was ready")
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(host, port, timeout=2)
            try:
                conn.request("GET", path)
                return conn.getresponse().status == 200
            finally:
                conn.close()
        return False

    wait_for(
        ready,
        f"{daemon.name} ready (GET http://{host}:{port}{path})",
        READY_TIMEOUT,
        interval=0.3,
        on_timeout=daemon.tail,
    )
