"""The meshed and plain pods whose calls the real node's Envoy tests follow (tests/node/
test_envoy_node.py, tests/node/test_migration_legs.py): in one namespace, a meshed and a plain
server (app.py serve), a server in TPROXY mode, then a meshed and a plain client whose
containers call them in loops (CALLS); the meshed client's outbound capture excludes
EXCLUDED_PORT by annotation. Meshed pods' istio-proxy is the `envoy` image."""

from __future__ import annotations

from typing import Any

from testbed import envoy_legs, kubepods
from testbed.envoy_legs import Call, Mesh
from testbed.realnode import RealCluster

PORT = 8080
EXCLUDED_PORT = 8081  # excluded from the meshed client's outbound capture by annotation
PORTS = (PORT, EXCLUDED_PORT)
TPROXY = {kubepods.INTERCEPTION_MODE: "TPROXY"}

CALLS = (
    Call("mesh-client", "app", "mesh-server", PORT),
    Call("mesh-client", "to-plain", "plain-server", PORT),
    Call("mesh-client", "excluded", "mesh-server", EXCLUDED_PORT),
    Call("mesh-client", "to-tproxy", "tproxy-server", PORT),
    Call("plain-client", "app", "mesh-server", PORT),
    Call("plain-client", "to-tproxy", "tproxy-server", PORT),
)
"""Each client's first call is its `app` container's."""


def start(cluster: RealCluster, core: Any, namespace: str) -> Mesh:
    """The servers Running and Ready, then the clients; the pods' IPs."""
    workload = cluster.images["workload"].ref
    proxy = cluster.images["envoy"].ref

    def create(name: str, command: list[str], meshed: bool, **extra: Any) -> None:
        manifest = kubepods.pod_manifest(
            name,
            workload,
            app_command=command,
            sidecar=meshed,
            proxy_image=proxy if meshed else None,
            **extra,
        )
        core.create_namespaced_pod(namespace, manifest)

    create("mesh-server", ["serve", str(PORT), str(EXCLUDED_PORT)], True)
    create("plain-server", ["serve", str(PORT)], False)
    create("tproxy-server", ["serve", str(PORT)], True, annotations=TPROXY)
    ips = {}
    for name in ("mesh-server", "plain-server", "tproxy-server"):
        view = kubepods.wait_running(core, namespace, name)
        assert view.ip, view
        ips[name] = view.ip

    def client(name: str, meshed: bool, **extra: Any) -> dict[str, Any]:
        first, *rest = (c for c in CALLS if c.client == name)

        def loop(call: Call) -> list[str]:
            return ["connect-loop", ips[call.server], str(call.port), "1"]

        manifest = kubepods.pod_manifest(
            name,
            workload,
            app_command=loop(first),
            sidecar=meshed,
            proxy_image=proxy if meshed else None,
            **extra,
        )
        manifest["spec"]["containers"] += [
            kubepods.container(c.container, workload, [*kubepods.APP, *loop(c)]) for c in rest
        ]
        return manifest

    excluded = {"traffic.sidecar.istio.io/excludeOutboundPorts": str(EXCLUDED_PORT)}
    core.create_namespaced_pod(namespace, client("mesh-client", True, annotations=excluded))
    core.create_namespaced_pod(namespace, client("plain-client", False))
    for name in ("mesh-client", "plain-client"):
        view = kubepods.wait_running(core, namespace, name)
        assert view.ip, view
        ips[name] = view.ip
    return Mesh(core, namespace, ips)


def record(mesh: Mesh) -> dict[Call, envoy_legs.Recorded]:
    """What each of CALLS produces now (envoy_legs.record)."""
    return envoy_legs.record(mesh, CALLS, PORTS)
