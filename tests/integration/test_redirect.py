"""A sidecar pod created through the API gets its rules from the agent during cnitool's ADD, and
its outbound TCP lands on the proxy's port (real traffic, checked by the original destination).
The chart's values reach the plugin's entry in the node's conflist."""

from __future__ import annotations

import pytest

from tests.integration.conftest import AGENT_NAMESPACE, EXCLUDED, MeshNode, has_istio_rules
from tests.integration.traffic import connect_from, listen_in, original_destination

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.chart]

PROXY_OUTBOUND_PORT = 15001


def test_chart_config_reaches_the_plugin_entry(mesh_node: MeshNode) -> None:
    conflist_types = [p["type"] for p in mesh_node.cni.reference_conflist()["plugins"]]
    assert conflist_types == ["bridge", "portmap"]  # what the node had before the agent
    entry = mesh_node.plugin_entry()
    assert entry["exclude_namespaces"] == EXCLUDED
    assert entry["plugin_log_level"] == "debug"
    assert entry["pod_namespace"] == AGENT_NAMESPACE
    assert mesh_node.installed.agent_pod.startswith(entry["agent_pod_prefix"])
    assert "pod_name" not in entry  # a rollout must not rewrite the node's CNI config
    assert entry["cni_agent_run_dir"] == str(mesh_node.harness.workdir / "run")
    assert mesh_node.plugin_binary.is_file()


def test_sidecar_pod_outbound_tcp_lands_on_the_proxy_port(mesh_node: MeshNode) -> None:
    pod = mesh_node.pod("default")
    sandbox = mesh_node.sandbox(pod)
    netns = str(sandbox.netns_path)

    result = mesh_node.cni.add(sandbox)

    gateway = result["ips"][0]["gateway"]
    assert has_istio_rules(sandbox)
    proxy = listen_in(netns, PROXY_OUTBOUND_PORT)
    try:
        client = connect_from(netns, gateway, 80)  # nothing listens on the gateway's port 80
        try:
            conn, _ = proxy.accept()
            with conn:
                assert original_destination(conn) == (gateway, 80)
                conn.sendall(b"proxy")
                assert client.recv(16) == b"proxy"
        finally:
            client.close()
    finally:
        proxy.close()


def test_without_rules_the_same_connect_is_refused(mesh_node: MeshNode) -> None:
    """The control for the test above: what makes the connection land is the redirect."""
    pod = mesh_node.pod("default", annotations={"sidecar.istio.io/inject": "false"})
    sandbox = mesh_node.sandbox(pod)
    netns = str(sandbox.netns_path)
    gateway = mesh_node.cni.add(sandbox)["ips"][0]["gateway"]
    proxy = listen_in(netns, PROXY_OUTBOUND_PORT)
    try:
        with pytest.raises(ConnectionRefusedError):
            connect_from(netns, gateway, 80).close()
    finally:
        proxy.close()
