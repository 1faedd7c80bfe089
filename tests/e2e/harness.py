"""Fixtures of the end-to-end tier (a plugin module listed in tests/conftest.py): the chart
installed into the test bed's API server, and the agent run as its DaemonSet would run it for
the simulated node (see daemon.py)."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from testbed.cni import CniNode
from testbed.daemon import REPO_ROOT, DaemonAgent, NodeDirs, cleanup_host_root, start_daemon_agent
from testbed.helm import Helm
from testbed.ports import free_port

CHART = REPO_ROOT / "charts" / "istio-cni"
RELEASE = "istio-cni"
# Held by this finalizer, the agent pod outlives its deletion until the agent process exited,
# as a pod object does until its kubelet reports the containers stopped.
AGENT_POD_FINALIZER = "e2e.istio-cni.test/agent-running"


@pytest.fixture(scope="session")
def plugin_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The standalone plugin, built by the same script as the image (`ci/build-plugin`)."""
    out = tmp_path_factory.mktemp("plugin-build")
    done = subprocess.run(
        [str(REPO_ROOT / "ci" / "build-plugin"), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"ci/build-plugin failed:\n{done.stderr[-3000:]}", pytrace=False)
    return out


@dataclass
class Installed:
    """A release of the chart and what the DaemonSet's pod on the simulated node would see."""

    helm: Helm
    namespace: str
    daemonset: dict[str, Any]
    agent_pod: str

    def config_yaml(self, core: Any) -> str:
        data = core.read_namespaced_config_map(RELEASE, self.namespace).data
        return str(data["config.yaml"])


class ChartOnNode:
    """Installs the chart, makes the DaemonSet's pod for the node, starts the agent for it."""

    def __init__(
        self,
        *,
        core: Any,
        apps: Any,
        node_name: str,
        cni_node: CniNode,
        plugin_build: Path,
        make_identity: Callable[..., Any],
        workdir: Path,
    ) -> None:
        self.core, self.apps = core, apps
        self.node_name = node_name
        self.cni_node = cni_node
        self.plugin_build = plugin_build
        self.make_identity = make_identity
        self.workdir = workdir
        self.agents: list[DaemonAgent] = []
        self.agent_pods: list[tuple[str, str]] = []
        self.agent_pod_uids: dict[tuple[str, str], str] = {}

    def install(
        self,
        helm: Helm,
        namespace: str,
        values: dict[str, Any] | None = None,
        values_files: tuple[Path, ...] = (),
    ) -> Installed:
        """helm install (with the test's run dir and a free metrics port) + the agent pod."""
        merged = {
            "cniAgentRunDir": str(self.workdir / "run"),
            "metricsPort": free_port(),
            "metricsAddress": "127.0.0.1",
            **(values or {}),
        }
        helm.run(
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--create-namespace",
            *(a for f in values_files for a in ("--values", str(f))),
            *(a for k, v in _flatten(merged) for a in ("--set-json", f"{k}={v}")),
        )
        if (RELEASE, namespace) not in helm.releases:  # an upgrade is the same release
            helm.releases.append((RELEASE, namespace))
        ds = self.apps.read_namespaced_daemon_set(RELEASE, namespace)
        ds_dict = dict(self.core.api_client.sanitize_for_serialization(ds))
        pod = self._make_agent_pod(namespace, ds_dict)
        return Installed(helm, namespace, ds_dict, pod)

    def _make_agent_pod(self, namespace: str, ds: dict[str, Any]) -> str:
        """The pod the DaemonSet controller would make on the node (no such controller runs)."""
        template = ds["spec"]["template"]
        name = f"{RELEASE}-{secrets.token_hex(3)[:5]}"  # as a DaemonSet names its pods
        made = self.core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": template["metadata"].get("labels", {}),
                    "finalizers": [AGENT_POD_FINALIZER],
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "DaemonSet",
                            "name": ds["metadata"]["name"],
                            "uid": ds["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {**template["spec"], "nodeName": self.node_name},
            },
        )
        self.agent_pods.append((namespace, name))
        self.agent_pod_uids[(namespace, name)] = made.metadata.uid
        return name

    def identity(self, namespace: str, pod: str | None = None) -> Any:
        """The token kubelet would project into the agent's pod (the latest one in `namespace`
        unless named): bound to that pod, so it names the pod's node."""
        if pod is None:
            pod = [n for ns, n in self.agent_pods if ns == namespace][-1]
        uid = self.agent_pod_uids[(namespace, pod)]
        return self.make_identity(namespace, RELEASE, bound_pod=(pod, uid))

    def start_agent(self, installed: Installed) -> DaemonAgent:
        identity = self.identity(installed.namespace, installed.agent_pod)
        agent = start_daemon_agent(
            config_yaml=installed.config_yaml(self.core),
            node=NodeDirs(self.cni_node.bin_dir, self.cni_node.conf_dir),
            plugin_build=self.plugin_build,
            kubeconfig=identity.kubeconfig,
            node_name=self.node_name,
            pod_name=installed.agent_pod,
            pod_namespace=installed.namespace,
            workdir=self.workdir / f"agent-{len(self.agents)}",
        )
        agent.token = identity.token  # so tests can check it never reaches a log
        self.agents.append(agent)
        return agent

    def release_agent_pod(self, namespace: str, name: str) -> None:
        """The agent process ended: let its pod object go, as the kubelet would."""
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
        if (namespace, name) in self.agent_pods:
            self.agent_pods.remove((namespace, name))

    def close(self) -> None:
        for agent in self.agents:
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
        for namespace, name in list(self.agent_pods):
            self.release_agent_pod(namespace, name)
        cleanup_host_root()


def _flatten(values: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    import json

    for key, value in values.items():
        if isinstance(value, dict) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", json.dumps(value)


@pytest.fixture
def chart_on_node(
    kube_core: Any,
    kube_config: str,
    sim_node: str,
    cni_node: CniNode,
    plugin_build: Path,
    make_identity: Callable[..., Any],
    tmp_path: Path,
) -> Iterator[ChartOnNode]:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kube_config)
    harness = ChartOnNode(
        core=kube_core,
        apps=k8s.AppsV1Api(api),
        node_name=sim_node,
        cni_node=cni_node,
        plugin_build=plugin_build,
        make_identity=make_identity,
        workdir=tmp_path / "e2e",
    )
    try:
        yield harness
    finally:
        for agent in harness.agents:
            # Captured by pytest and shown only when the test failed.
            with contextlib.suppress(OSError):
                print(f"--- agent log {agent.log_path} ---\n{agent.logs()[-30000:]}")
        harness.close()
        api.close()


def helm_binary(binaries: dict[str, Path], major: str) -> Path:
    """The installed Helm binary of a major version ("3", "4"); fails naming what is there."""
    found = [v for v in binaries if v.split(".")[0] == major]
    if not found:
        pytest.fail(
            f"no Helm {major}.x among the test bed's Helm binaries {sorted(binaries)}; "
            "run ci/setup-helm",
            pytrace=False,
        )
    return binaries[max(found, key=lambda v: tuple(int(p) for p in v.split(".")))]
