"""A real Envoy as the sidecar of pods on the real node (kubelet, containerd, the agent installed
by Helm): meshed pods' istio-proxy is the test bed's `envoy` image (testbed/envoy.py's static
sidecar bootstrap), and the apps' own connections are carried by it. Each leg is read from the
Envoys' access logs (their container logs, through the API) and from the apps' logs:

- meshed -> meshed: the client Envoy's outbound leg to the server pod's IP:port, the server
  Envoy's inbound leg to its app, which sees the connection from 127.0.0.6;
- meshed -> plain and plain -> meshed: the one Envoy on the way logs its leg;
- `traffic.sidecar.istio.io/excludeOutboundPorts`: that port leaves without the client Envoy;
- a server in TPROXY mode (`sidecar.istio.io/interceptionMode`): its app sees the client's own
  address, not 127.0.0.6.

One agent, one namespace and the five pods serve the module's tests (the pods' connect loops
run from the start; each test reads its own leg)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from bench.soak.sidecar import SidecarCheck
from testbed import chart as agent_mod
from testbed import envoy, envoy_pods, images, kubepods
from testbed.envoy_legs import Mesh, access_log, answer, assert_meshed_to_meshed, wait_leg
from testbed.envoy_pods import EXCLUDED_PORT, PORT
from testbed.helm import Helm
from testbed.images import Image
from testbed.parts import MissingPartError
from testbed.realnode import RealCluster
from tests.node.conftest import helm_by_major, release_node

pytestmark = [pytest.mark.node, pytest.mark.dataplane]

PASSTHROUGH_SOURCE = envoy.INBOUND_PASSTHROUGH_V4


@pytest.fixture(scope="module")
def mesh(
    real_cluster: RealCluster,
    node_core: Any,
    agent_image: Image,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mesh]:
    """The agent installed, the Envoy image on the node, and in a fresh namespace the pods of
    testbed/envoy_pods.py, their calls looping."""
    try:
        real_cluster.import_image(images.image("envoy"))
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    home = tmp_path_factory.mktemp("helm")
    helm = Helm(binary=helm_by_major("4"), kubeconfig=real_cluster.kubeconfig, home=home)
    reference = json.dumps(real_cluster.reference_conflist(), indent=2) + "\n"
    with contextlib.ExitStack() as stack:
        stack.callback(release_node, real_cluster, node_core, [helm], reference)
        agent_mod.install(helm, real_cluster, node_core, agent_image)
        namespace = stack.enter_context(kubepods.pod_namespace(node_core, "envoy"))
        yield envoy_pods.start(real_cluster, node_core, namespace)


def test_meshed_to_meshed_through_both_envoys(mesh: Mesh) -> None:
    assert_meshed_to_meshed(mesh, "mesh-client", "mesh-server", PORT)


def test_meshed_to_plain_through_the_client_envoy(mesh: Mesh) -> None:
    client, server = mesh.ips["mesh-client"], mesh.ips["plain-server"]
    line = answer(mesh, "mesh-client", "to-plain", "plain-server", PORT)
    assert f"peer={client}:" in line, line  # Envoy's upstream leaves from the pod's address
    out = wait_leg(
        mesh,
        "mesh-client",
        envoy.OUTBOUND_LISTENER,
        downstream_remote=f"{client}:",
        upstream_host=f"{server}:{PORT}",
        flags="-",  # the app's answer came through a leg that connected; earlier tries may not
    )
    assert out["cluster"] == envoy.PASSTHROUGH and out["flags"] == "-", out
    assert line.split(f"peer={client}:")[1].split()[0] in {
        leg["upstream_local"].rsplit(":", 1)[1]
        for leg in access_log(mesh, "mesh-client")
        if leg["upstream_host"] == f"{server}:{PORT}"
    }, line  # the port the plain app saw is one of the client Envoy's upstream legs


def test_plain_to_meshed_through_the_server_envoy(mesh: Mesh) -> None:
    client, server = mesh.ips["plain-client"], mesh.ips["mesh-server"]
    line = answer(mesh, "plain-client", "app", "mesh-server", PORT)
    assert f"peer={PASSTHROUGH_SOURCE}:" in line, line
    inbound = wait_leg(
        mesh,
        "mesh-server",
        envoy.INBOUND_LISTENER,
        downstream_remote=f"{client}:",
        downstream_local=f"{server}:{PORT}",
        upstream_host=f"{server}:{PORT}",
        upstream_local=f"{PASSTHROUGH_SOURCE}:",
    )
    assert inbound["cluster"] == envoy.INBOUND_PASSTHROUGH, inbound


def test_excluded_outbound_port_bypasses_the_client_envoy(mesh: Mesh) -> None:
    client, server = mesh.ips["mesh-client"], mesh.ips["mesh-server"]
    line = answer(mesh, "mesh-client", "excluded", "mesh-server", EXCLUDED_PORT)
    # Still captured inbound by the meshed server, straight from the client app's socket.
    assert f"peer={PASSTHROUGH_SOURCE}:" in line, line
    wait_leg(
        mesh,
        "mesh-server",
        envoy.INBOUND_LISTENER,
        downstream_remote=f"{client}:",
        downstream_local=f"{server}:{EXCLUDED_PORT}",
    )

    # The other port goes through the client Envoy (the app's loop on 8080): once two more of
    # its legs are logged after that answer, a leg on the excluded port would be too (one log).
    def legs_to(port: int) -> list[dict[str, str]]:
        return [
            leg
            for leg in access_log(mesh, "mesh-client")
            if leg["listener"] == envoy.OUTBOUND_LISTENER
            and leg["upstream_host"] == f"{server}:{port}"
        ]

    before = len(legs_to(PORT))
    kubepods.wait_for(
        lambda: len(legs_to(PORT)) >= before + 2, f"two more outbound legs to {PORT}", 30
    )
    assert not legs_to(EXCLUDED_PORT), legs_to(EXCLUDED_PORT)


@pytest.mark.parametrize("client", ["plain-client", "mesh-client"])
def test_tproxy_inbound_hands_the_app_the_clients_own_address(mesh: Mesh, client: str) -> None:
    """A server pod in TPROXY mode: its Envoy takes the connection transparently and connects to
    its app from the client's own address (original_src), where REDIRECT shows 127.0.0.6. From
    a meshed client that address is its pod's, where its own Envoy's upstream leaves from."""
    source, server = mesh.ips[client], mesh.ips["tproxy-server"]
    line = answer(mesh, client, "to-tproxy", "tproxy-server", PORT)
    assert f"peer={source}:" in line and "echo=hello" in line, line
    inbound = wait_leg(
        mesh,
        "tproxy-server",
        envoy.INBOUND_LISTENER,
        downstream_remote=f"{source}:",
        downstream_local=f"{server}:{PORT}",
        upstream_host=f"{server}:{PORT}",
        upstream_local=f"{source}:",
    )
    assert inbound["cluster"] == envoy.INBOUND_PASSTHROUGH and inbound["flags"] == "-", inbound
    # The app saw that leg's own source, port included.
    seen = f"app port={PORT} peer={inbound['upstream_local']}"
    kubepods.wait_log_line(
        mesh.core, mesh.namespace, "tproxy-server", "app", lambda s: seen in s, f"'{seen}'"
    )


def test_the_soaks_sidecar_check_tells_a_pod_through_its_envoy_from_one_that_escapes(
    mesh: Mesh, real_cluster: RealCluster
) -> None:
    """The soak's check (bench/soak/sidecar.py) on the real node: an app calling the plain
    server from its first instant is answered through its pod's Envoy, which proves the pod
    captured without reading its rules; the same app with the server's port excluded from
    capture is answered on its own socket, and the check says uncaptured although Istio's
    rules are in that pod's netns."""
    workload = real_cluster.images["workload"].ref
    command = ["connect-loop", mesh.ips["plain-server"], str(PORT), "0.5"]
    excluded = {"traffic.sidecar.istio.io/excludeOutboundPorts": str(PORT)}
    check = SidecarCheck(mesh.core, mesh.namespace, real_cluster.pod_netns)
    pods = {"through-envoy": {}, "escaping": excluded}
    try:
        for name, notes in pods.items():
            manifest = kubepods.pod_manifest(
                name, workload, app_command=command, sidecar=True,
                proxy_image=images.image("envoy").ref, annotations=notes,
            )  # fmt: skip
            mesh.core.create_namespaced_pod(mesh.namespace, manifest)
        verdicts = {}
        for name in pods:
            kubepods.wait_running(mesh.core, mesh.namespace, name)
            item = mesh.core.read_namespaced_pod(name, mesh.namespace)

            def judged(item: Any = item) -> list[bool] | None:
                found = check(item)
                return None if found is None else [found]

            verdicts[name] = kubepods.wait_for(judged, f"the check's verdict on {name}", 60)[0]
        assert verdicts == {"through-envoy": True, "escaping": False}, verdicts
        assert check.through_proxy == 1
    finally:
        for name in pods:
            with contextlib.suppress(Exception):
                mesh.core.delete_namespaced_pod(name, mesh.namespace, grace_period_seconds=0)
