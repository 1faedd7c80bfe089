"""The same calls give the same legs whichever agent's plugin made the pods' rules: with Istio's
own node agent serving the real node (testbed/istio_agent.py), then after the node moved to ours
by README's procedure (testbed/migration.py).

Under each agent, fresh pods of testbed/envoy_pods.py (meshed pods' istio-proxy a real Envoy)
make its calls: meshed -> meshed, meshed -> plain, plain -> meshed, an outbound port excluded
by annotation and one captured, and a server in TPROXY mode from a meshed and a plain client.
Each call's record (testbed/envoy_legs.record) is every leg its connections leave in the Envoys'
access logs (listener, cluster, flags, the addresses named by role: client pod, server pod,
127.0.0.6, with the server's port) and the peer the server's app saw. The records under the two
agents are equal, and the pods started under Istio's plugin, their rules left as they were,
still give the same records after the move.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import envoy, envoy_pods, images, istio_agent, kubepods, nodetaint, podnet
from testbed.envoy_legs import Mesh, assert_meshed_to_meshed, describe, differences, has_envoy
from testbed.envoy_pods import EXCLUDED_PORT, PORT
from testbed.images import Image
from testbed.migration import ISTIO_VALUES, TAINT, istio_to_ours
from testbed.parts import MissingPartError
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.migration, pytest.mark.dataplane]

MESHED, SERVER = "mesh-client", "mesh-server"


def import_images(cluster: RealCluster) -> Image:
    """The Envoy and Istio's agent images on the node; Istio's agent's."""
    try:
        cluster.import_image(images.image("envoy"))
        istio_image = images.image("install-cni")
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    cluster.import_image(istio_image)
    return istio_image


def meshed_rules(cluster: RealCluster, mesh: Mesh) -> dict[str, str]:
    """Each meshed pod's tables (its netns's, every table, counters stripped)."""
    rules = {}
    for pod in mesh.ips:
        if has_envoy(mesh, pod):
            view = kubepods.pod_view(mesh.core, mesh.namespace, pod)
            assert view is not None, pod
            rules[pod] = podnet.saved_tables(cluster.pod_netns(view.uid))
    return rules


def test_the_same_calls_give_the_same_legs_under_istios_plugin_and_ours(
    real_cluster: RealCluster, node_helm: Any, node_core: Any, agent_image: Image
) -> None:
    istio_image = import_images(real_cluster)
    helm = node_helm("3")
    before = real_cluster.conflist_path.read_bytes()
    started = time.monotonic()
    try:
        istio_agent.install(helm, real_cluster, node_core, istio_image, **ISTIO_VALUES)
        with (
            kubepods.pod_namespace(node_core, "istio") as istio_ns,
            kubepods.pod_namespace(node_core, "ours") as ours_ns,
        ):
            under_istio = envoy_pods.start(real_cluster, node_core, istio_ns)
            istio_rules = meshed_rules(real_cluster, under_istio)
            assert all("ISTIO_OUTPUT" in r for r in istio_rules.values()), istio_rules
            istio = envoy_pods.record(under_istio)
            print(f"under Istio's agent:\n{describe(istio)}")

            istio_to_ours(helm, real_cluster, node_core, agent_image)
            under_ours = envoy_pods.start(real_cluster, node_core, ours_ns)
            ours = envoy_pods.record(under_ours)
            print(f"under ours:\n{describe(ours)}")
            after = envoy_pods.record(under_istio)
            print(f"Istio's plugin's pods under ours:\n{describe(after)}")

            # Checked as the dataplane tier checks it, so that the records compared are right
            # and not only alike: meshed -> meshed through both Envoys, and the excluded port
            # past the client's Envoy while the captured one goes through it.
            assert_meshed_to_meshed(under_ours, MESHED, SERVER, PORT)
            by_call = {(c.client, c.server, c.port): r for c, r in ours.items()}
            envoys = {
                port: {(leg.envoy, leg.listener) for leg in by_call[MESHED, SERVER, port].legs}
                for port in (PORT, EXCLUDED_PORT)
            }
            assert envoys == {
                PORT: {(MESHED, envoy.OUTBOUND_LISTENER), (SERVER, envoy.INBOUND_LISTENER)},
                EXCLUDED_PORT: {(SERVER, envoy.INBOUND_LISTENER)},
            }, describe(ours)

            moved = differences({"Istio's plugin": istio, "ours": ours})
            assert not moved, f"the same calls, other legs:\n{moved}"
            kept = differences({"before the move": istio, "after": after})
            assert not kept, f"Istio's plugin's pods, other legs under ours:\n{kept}"
            assert meshed_rules(real_cluster, under_istio) == istio_rules
        print(f"the test's node time: {time.monotonic() - started:.0f}s")

        # Ours leaves the node's conflist as it found it after Istio's agent had gone, which
        # wrote it back in its own encoding (Go's: keys sorted); the next test starts from the
        # node's own bytes.
        agent_mod.uninstall(helm, node_core)
        assert json.loads(real_cluster.conflist_path.read_bytes()) == json.loads(before)
        real_cluster.conflist_path.write_bytes(before)
    finally:
        nodetaint.remove(node_core, real_cluster.node_name, TAINT)
