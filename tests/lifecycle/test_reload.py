"""A changed config.yaml reaches every service of a running agent (agent/lifecycle.py): the HTTP
server moves to the new metricsPort, the plugin's conflist entry carries the new excluded
namespaces, the pod server decides with them (against the real kube-apiserver), and an invalid
change is logged and ignored while the old settings keep working."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from agent.install import conflist
from plugin import wire
from testbed.agent_host import (
    Node,
    RunningAgent,
    agent_command,
    http_get,
    running_agent,
    wait_installed,
    wait_status,
)
from testbed.node import NodePods
from testbed.ports import free_port
from testbed.wait import wait_for
from tests.podserver.helpers import call

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


def replace_config(path: pathlib.Path, **changes: Any) -> None:
    """Change keys of config.yaml in one rename, as a ConfigMap update lands (never half-made)."""
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(yaml.safe_dump(data))
    os.replace(tmp, path)


def excluded_in_entry(node: Node) -> list[str] | None:
    """exclude_namespaces of our entry in the primary conflist; None while there is no entry."""
    try:
        plugins = node.conf("10-net.conflist")["plugins"]
    except (OSError, ValueError, KeyError):
        return None
    ours = [p for p in plugins if conflist.is_ours(p)]
    return list(ours[0].get("exclude_namespaces", [])) if len(ours) == 1 else None


def port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def start(node: Node) -> tuple[pathlib.Path, int]:
    node.write_primary(LIST)
    port = free_port()
    return node.write_config_yaml(metricsPort=port, excludeNamespaces=["kube-system"]), port


def logged(agent: RunningAgent, text: str) -> bool:
    return text in agent.log.read_text()


def test_every_service_follows_a_reload(node: Node) -> None:
    config, old_port = start(node)
    with running_agent(agent_command("run", "--config", str(config))) as agent:
        wait_installed(old_port)
        assert excluded_in_entry(node) == ["kube-system"]

        new_port = free_port()
        replace_config(config, metricsPort=new_port, excludeNamespaces=["kube-system", "team-b"])
        wait_for(
            lambda: excluded_in_entry(node) == ["kube-system", "team-b"],
            "the conflist entry to carry the new excluded namespaces",
            10,
            on_timeout=lambda: f"entry: {excluded_in_entry(node)}\n{agent.log.read_text()}",
        )
        wait_installed(new_port)
        assert http_get(new_port, "/healthz")[0] == 200
        assert "istio_cni_install_ready 1.0" in http_get(new_port, "/metrics")[1]
        wait_for(lambda: port_closed(old_port), f"old port {old_port} to close", 10)
        assert agent.proc.poll() is None, agent.log.read_text()
        code, log = agent.stop()
    assert code == 0, log
    assert "restarting the services with the changed config" in log


def test_invalid_change_is_logged_and_ignored(node: Node) -> None:
    config, port = start(node)
    with running_agent(agent_command("run", "--config", str(config))) as agent:
        wait_installed(port)
        replace_config(config, metricsPort=free_port(), excludeNamespaces="team-b")  # not a list
        wait_for(
            lambda: logged(agent, "config file changed but is invalid"),
            "the agent to log the invalid config",
            10,
            on_timeout=agent.log.read_text,
        )
        assert "excludeNamespaces" in agent.log.read_text()  # names the bad key
        # The old settings keep working: the same port serves, the entry is unchanged.
        wait_installed(port)
        assert excluded_in_entry(node) == ["kube-system"]
        assert not logged(agent, "restarting the services")
        assert agent.proc.poll() is None, agent.log.read_text()
        code, log = agent.stop()
    assert code == 0, log


SIDECAR = {
    "containers": [
        {"name": "app", "image": "registry.invalid/app:1"},
        {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
    ],
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
}


@pytest.fixture
def short_run_dir(node: Node) -> Iterator[pathlib.Path]:
    """The agent's run dir under /tmp: a socket path must stay under 108 bytes."""
    run_dir = pathlib.Path("/tmp") / f"reload-{os.getpid()}-{node.root.name[-12:]}"
    try:
        yield run_dir
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def add_request(pod: dict[str, Any]) -> bytes:
    """The plugin's ADD for `pod`, in a netns that does not exist: a pod the agent decides to
    capture fails (fail closed) at applying the rules, one it skips is answered 200."""
    meta = pod["metadata"]
    return wire.encode(
        wire.cni_request(
            command="ADD",
            container_id="sandbox-reload",
            netns="/var/run/netns/reload-test-absent",
            ifname="eth0",
            pod_name=meta["name"],
            pod_namespace=meta["namespace"],
            pod_uid=meta["uid"],
            cni_version="1.0.0",
            prev_result=None,
        )
    )


@pytest.mark.cluster
def test_pod_server_decides_with_the_reloaded_exclusions(
    node: Node,
    kube_config: str,
    sim_node: str,
    node_pods: NodePods,
    random_namespace_function_scope: Any,
    short_run_dir: pathlib.Path,
) -> None:
    namespace = str(random_namespace_function_scope.name)
    pod = node_pods.create(namespace, "with-sidecar", **SIDECAR)
    node.write_primary(LIST)
    port = free_port()
    config = node.write_config_yaml(
        metricsPort=port,
        excludeNamespaces=["kube-system"],
        cniAgentRunDir=str(short_run_dir),
        repair={"enabled": False},  # only the pod server acts on the pod here
    )
    socket_path = wire.socket_path(str(short_run_dir))
    command = agent_command("run", "--config", str(config))
    with running_agent(command, KUBECONFIG=kube_config, NODE_NAME=sim_node) as agent:
        wait_status(port, "/readyz", 200, timeout=30)
        status, body = call(socket_path, "POST", wire.PATH_ADD, add_request(pod))
        assert status == 500 and "apply redirect rules" in body["msg"], body  # decided: capture

        replace_config(config, excludeNamespaces=["kube-system", namespace])
        wait_for(
            lambda: excluded_in_entry(node) == ["kube-system", namespace],
            "the conflist entry to carry the new excluded namespaces",
            10,
            on_timeout=agent.log.read_text,
        )

        def skipped() -> dict[str, Any] | None:
            try:
                status, body = call(socket_path, "POST", wire.PATH_ADD, add_request(pod))
            except OSError:  # the pod server is being restarted
                return None
            return body if status == 200 and body.get("result") == "skipped" else None

        body = wait_for(skipped, "the pod server to skip the newly excluded namespace", 15)
        assert body["reason"] == f"namespace {namespace} is excluded", body
        code, log = agent.stop()
    assert code == 0, log
