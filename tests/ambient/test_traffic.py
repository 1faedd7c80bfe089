"""Ambient capture proven by real traffic through the ztunnel test double.

A "node" namespace of the test holds a bridge; three "pods" (namespaces of the test) hang off it
by veth: `web` (enrolled), `plain` (never enrolled) and `peer` (the client). The real mesh
dataplane (agent.ambient.mesh) enrolls `web` with the real in-pod rules (iptables-nft, or Istio's
native nftables tables), the real host probe rules in the node namespace, and the real ZDS server,
which hands the pod's netns to the ztunnel test double; the double opens its transparent
listeners (15001/15006/15008) inside `web`. Then, over IPv4 and IPv6:

- peer -> web:8080 lands on the double's 15006 in `web` with web:8080 as original destination,
  never on the app; peer -> web:15008 reaches the double's HBONE listener directly;
- web -> peer lands on the double's 15001 with the peer as original destination;
- the node's probe reaches web's app, SNATed to Istio's probe address;
- peer -> plain:8080 reaches plain's app and the double records nothing;
- after release (mesh remove), peer -> web:8080 reaches the app again.

The pods' annotation goes to a named fake annotator (the API server's side is in test_live.py).
Every namespace, link and process is the test's own and goes away even when a test fails.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.ambient.mesh import MeshDataplane, rule_options_for
from agent.ambient.zds import ZdsServer
from agent.constants import HOST_PROBE_SNAT_V4, HOST_PROBE_SNAT_V6
from agent.netns.look import netns_addresses
from agent.podnetns.finder import PodNetnsFinder
from agent.rules.ambient.apply import HostProbeRules, InpodRules
from agent.rules.ambient.options import PodRuleOptions
from testbed import netns
from testbed.kubepods import wait_for
from testbed.zds_checks import PodIdentity
from testbed.ztunnel_double import HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT, ZtunnelDouble
from tests.ambient.fakes import FakeAnnotator
from tests.rules.podnet import _enter

pytestmark = pytest.mark.ambient

BACKENDS = ["iptables-nft", "nftables"]
APP_PORT = 8080

# Answers each TCP connection with "app|LABEL|LOCAL|PEER" on IPv4 and IPv6.
APP = r"""
import socket, sys, threading
def addr(a):
    return f"[{a[0]}]:{a[1]}" if ":" in a[0] else f"{a[0]}:{a[1]}"
def serve(sock):
    while True:
        conn, peer = sock.accept()
        with conn:
            conn.sendall(f"app|{sys.argv[2]}|{addr(conn.getsockname())}|{addr(peer)}".encode())
for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, int(sys.argv[1])))
    sock.listen(16)
    threading.Thread(target=serve, args=(sock,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

CLIENT = r"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as s:
        print(s.recv(256).decode())
except OSError as e:
    print(f"error|{type(e).__name__}")
"""


def hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass
class Host:
    """A namespace on the bridge: the node (the bridge's own addresses) or a pod."""

    netns: str
    ip: str
    ip6: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"

    def ips(self) -> tuple[str, str]:
        return self.ip, self.ip6


@dataclass
class Lan:
    node: Host
    web: Host
    plain: Host
    peer: Host
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def serve_app(self, host: Host, label: str) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", APP, str(APP_PORT), label],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_enter(host.path, None),
        )
        self.procs.append(proc)  # the lan fixture kills it
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", (
            f"app in {host.netns}: {line} {proc.stderr.read() if proc.stderr else ''}"
        )

    def connect(self, source: Host, ip: str, port: int = APP_PORT) -> list[str]:
        """Connect from `source` to ip:port; the answer split on '|'."""
        done = subprocess.run(
            [sys.executable, "-I", "-c", CLIENT, ip, str(port)],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=_enter(source.path, None),
        )
        return (done.stdout.strip() or f"error|{done.stderr.strip()[-200:]}").split("|")


@pytest.fixture
def lan() -> Iterator[Lan]:
    """The node namespace with a bridge and three pods on it; all deleted afterwards."""
    tag = secrets.token_hex(3)
    third = int(tag[:2], 16)
    v4, v6 = f"10.233.{third}", str(ipaddress.ip_address(f"fd33:{tag[:4]}::"))
    names = {role: f"amb-tr-{role}-{tag}" for role in ("node", "web", "plain", "peer")}
    hosts = {
        role: Host(names[role], f"{v4}.{i}", f"{v6}{i}")
        for i, role in enumerate(("node", "web", "plain", "peer"), start=1)
    }
    made: list[str] = []
    net = Lan(node=hosts["node"], web=hosts["web"], plain=hosts["plain"], peer=hosts["peer"])
    try:
        for name in names.values():
            netns.add(name)
            made.append(name)
        node = names["node"]
        netns.ip("link", "add", "br0", "type", "bridge", netns=node)
        for address in (f"{net.node.ip}/24", f"{net.node.ip6}/64"):
            netns.ip("addr", "add", address, "dev", "br0", "nodad", netns=node)
        netns.ip("link", "set", "br0", "up", netns=node)
        for i, role in enumerate(("web", "plain", "peer")):
            pod, veth = hosts[role], f"vt{tag}{i}"
            # Made inside the node namespace, its peer end straight into the pod's.
            netns.ip(
                "link",
                "add",
                veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                pod.netns,
                netns=node,
            )
            netns.ip("link", "set", veth, "master", "br0", "up", netns=node)
            netns.ip("addr", "add", f"{pod.ip}/24", "dev", "eth0", netns=pod.netns)
            netns.ip("addr", "add", f"{pod.ip6}/64", "dev", "eth0", "nodad", netns=pod.netns)
            netns.ip("link", "set", "eth0", "up", netns=pod.netns)
            # The node is the gateway: replies to the probe address (off-link) go back there.
            netns.ip("route", "add", "default", "via", net.node.ip, netns=pod.netns)
            netns.ip("-6", "route", "add", "default", "via", net.node.ip6, netns=pod.netns)
        yield net
    finally:
        for proc in net.procs:
            proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for name in made:
            netns.delete(name)


@dataclass
class Mesh:
    dataplane: MeshDataplane
    ztunnel: ZtunnelDouble
    host: HostProbeRules
    rules: InpodRules
    annotator: FakeAnnotator


@pytest.fixture(params=BACKENDS)
def mesh(request: pytest.FixtureRequest, lan: Lan, tmp_path: Path) -> Iterator[Mesh]:
    """The real mesh dataplane and ZDS server, with the ztunnel test double connected."""
    backend: str = request.param
    server = ZdsServer(str(tmp_path / "zds.sock"))
    # nftables matches kubelet's UID on the node; the test's probes run as root.
    host = HostProbeRules(
        lan.node.path,
        ipv6=True,
        backend=backend,
        kubelet_uid="0" if backend == "nftables" else None,
    )
    rules = InpodRules(backend=backend)
    annotator = FakeAnnotator([])
    dataplane = MeshDataplane(
        pod_rules=rules,
        host_rules=host,
        ztunnel=server,
        annotator=annotator,
        find_netns=PodNetnsFinder(
            proc_dir="/proc", netns_dir="/run/netns", read_addresses=netns_addresses
        ),
        options_for=rule_options_for(PodRuleOptions(ipv6=True)),
    )
    double = ZtunnelDouble(server.socket_path)
    try:
        server.start()
        host.ensure()  # its rules and sets live in the node namespace: they go with it
        double.connect()
        wait_for(lambda: server.connected, "ZDS server sees the ztunnel test double", timeout=10)
        yield Mesh(dataplane, double, host, rules, annotator)
    finally:
        try:
            double.close()  # its listeners and threads; fails on what ztunnel would not take
        finally:
            server.stop()


def api_pod(name: str, pod: Host) -> dict[str, Any]:
    """The pod as the API server would report it, running with both addresses."""
    return {
        "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}-{pod.netns}"},
        "spec": {"serviceAccountName": name},
        "status": {"phase": "Running", "podIPs": [{"ip": pod.ip}, {"ip": pod.ip6}]},
    }


def enroll(mesh: Mesh, lan: Lan) -> str:
    """Enroll `web` (its netns given, as a CNI ADD does); its uid once the double listens there."""
    pod = api_pod("web", lan.web)
    uid = str(pod["metadata"]["uid"])
    mesh.ztunnel.tell(PodIdentity(uid, "web", "shop", "web"))
    mesh.dataplane.add(pod, lan.web.path)
    mesh.ztunnel.wait_for("web's workload", lambda z: uid in z.workloads())
    assert mesh.annotator.values == {"shop/web": "enabled"}
    return uid


def accepted(mesh: Mesh) -> list[Any]:
    """Every connection the double's listeners accepted, over all its workloads."""
    return [a for w in mesh.ztunnel.workloads().values() for a in w.accepted]


def test_inbound_to_an_enrolled_pod_lands_on_ztunnel_not_the_app(lan: Lan, mesh: Mesh) -> None:
    for host, label in ((lan.web, "web"), (lan.peer, "peer")):
        lan.serve_app(host, label)
    assert lan.connect(lan.peer, lan.web.ip)[:2] == ["app", "web"]  # before: plain delivery
    uid = enroll(mesh, lan)
    workload = mesh.ztunnel.workloads()[uid]

    for ip in lan.web.ips():
        # Inbound to the app's port: captured into the pod's "ztunnel" on 15006 (REDIRECT) with
        # the app's address as original destination, from the peer's own address.
        assert lan.connect(lan.peer, ip) == ["ztunnel-double", uid, str(INBOUND_PORT)]
        got = workload.accepted[-1]
        assert (got.port, got.local) == (INBOUND_PORT, hostport(ip, INBOUND_PORT))
        assert got.original_dst == hostport(ip, APP_PORT)
        assert got.peer.rsplit(":", 1)[0].strip("[]") in lan.peer.ips()
        # HBONE: 15008 is reached directly, not redirected.
        assert lan.connect(lan.peer, ip, HBONE_PORT) == ["ztunnel-double", uid, str(HBONE_PORT)]
        got = workload.accepted[-1]
        assert (got.port, got.local) == (HBONE_PORT, hostport(ip, HBONE_PORT))
        assert got.original_dst == hostport(ip, HBONE_PORT)
        # The node's probe skips ztunnel: it reaches the app, SNATed to the probe address.
        answer = lan.connect(lan.node, ip)
        assert answer[:3] == ["app", "web", hostport(ip, APP_PORT)]
        snat = HOST_PROBE_SNAT_V4 if ":" not in ip else HOST_PROBE_SNAT_V6
        assert answer[3].rsplit(":", 1)[0].strip("[]") == snat

    # Outbound from the pod: captured on 15001 with the peer as original destination.
    assert lan.connect(lan.web, lan.peer.ip) == ["ztunnel-double", uid, str(OUTBOUND_PORT)]
    got = workload.accepted[-1]
    assert (got.port, got.original_dst) == (OUTBOUND_PORT, hostport(lan.peer.ip, APP_PORT))
    assert [a.port for a in workload.accepted] == [INBOUND_PORT, HBONE_PORT] * 2 + [OUTBOUND_PORT]


def test_others_and_released_pods_reach_the_app_directly(lan: Lan, mesh: Mesh) -> None:
    for host, label in ((lan.web, "web"), (lan.plain, "plain")):
        lan.serve_app(host, label)
    uid = enroll(mesh, lan)
    assert lan.connect(lan.peer, lan.web.ip)[0] == "ztunnel-double"  # web is captured...
    before = accepted(mesh)
    for ip in lan.plain.ips():  # ...plain, beside it on the same bridge, is not
        answer = lan.connect(lan.peer, ip)
        assert answer[:3] == ["app", "plain", hostport(ip, APP_PORT)]
        assert answer[3].rsplit(":", 1)[0].strip("[]") in lan.peer.ips()
        assert lan.connect(lan.plain, lan.peer.ip)[0] != "ztunnel-double"  # nothing outbound
    assert accepted(mesh) == before and list(mesh.ztunnel.workloads()) == [uid]

    mesh.dataplane.remove(api_pod("web", lan.web), deleted=False)
    mesh.ztunnel.wait_for("web's workload deleted", lambda z: not z.workloads())
    assert mesh.annotator.values == {"shop/web": None}
    assert mesh.host.entries() == {}
    assert not mesh.rules.present(lan.web.path, PodRuleOptions(ipv6=True))
    for ip in lan.web.ips():
        answer = lan.connect(lan.peer, ip)
        assert answer[:3] == ["app", "web", hostport(ip, APP_PORT)]
        # And the node's connection is its own again (out of the probe set).
        answer = lan.connect(lan.node, ip)
        assert answer[3].rsplit(":", 1)[0].strip("[]") in lan.node.ips()
