"""The scale tier's loaded API server, shared by the tier: the test bed's control plane in a node
network namespace's reach, with the agent's own identity, an audit log of what that identity
reads, a few pods on the agent's node, and then a large cluster's objects (testbed/apiload.py).

Before the load, one agent runs on the empty cluster and its memory is recorded (`baseline`):
what the agent costs with nothing elsewhere, against which the loaded runs are measured.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testbed import apiload
from testbed.agent_host import RunningAgent, agent_command, make_node, running_agent
from testbed.controlplane import Binaries, ControlPlane
from testbed.identity import Identity, service_account_identity
from testbed.node import NodePods, new_core, register_node
from testbed.nodenet import NodeNetwork
from testbed.process import PartFailedError
from testbed.wait import wait_for

NODE = "scale-node"
AGENT_NAMESPACE = "scale-agent"
AGENT_ACCOUNT = "istio-cni"
AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"
NAMESPACES = 2000
PODS = 20000
OWN_PODS = 3
METRICS_PORT = 15014
SETTLE_SECONDS = 2.0
"""After Ready: the first relist's garbage collected, the watches open."""
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    "containers": [
        {"name": "app", "image": "registry.invalid/app:1"},
        {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
    ],
}
# Only what the agent's identity reads of pods and namespaces: the load itself is not logged.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["{AGENT_USER}"]
  verbs: [get, list, watch]
  resources: [{{group: "", resources: [pods, namespaces]}}]
- level: None
"""
AGENT_RIGHTS = [
    {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@dataclass(frozen=True)
class Memory:
    rss_mib: float
    """VmRSS once settled."""
    peak_mib: float
    """VmHWM: the highest RSS since the process started (its start-up lists included)."""

    def __str__(self) -> str:
        return f"RSS {self.rss_mib:.1f} MiB (peak {self.peak_mib:.1f} MiB)"


@dataclass
class LoadedApi:
    network: NodeNetwork
    plane: ControlPlane
    identity: Identity
    workdir: Path
    baseline: Memory | None = None
    loaded: apiload.Loaded | None = None

    @contextlib.contextmanager
    def run_agent(self) -> Iterator[RunningAgent]:
        """An agent for NODE in the node netns, Ready, its caches listed and settled."""
        root = self.workdir / f"agent-{secrets.token_hex(3)}"
        root.mkdir()
        node = make_node(root)
        (node.conf_dir / "10-net.conflist").write_text(
            json.dumps({"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]})
        )
        run_dir = Path("/tmp") / f"scale-{secrets.token_hex(4)}"  # socket paths stay short
        config = node.write_config_yaml(
            metricsAddress=self.network.node_ip,
            metricsPort=METRICS_PORT,
            cniAgentRunDir=str(run_dir),
            uninstallOnStop="never",
            hostProcDir="/proc",
            logAsJson=True,
            ambient={"enabled": True, "ipv6": False, "ztunnelSocketPath": f"{run_dir}/zt.sock"},
        )
        command = [*self.network.nsenter(), *agent_command("run", "--config", str(config))]
        env = {"KUBECONFIG": str(self.identity.kubeconfig), "NODE_NAME": NODE}
        try:
            with running_agent(command, **env) as agent:
                wait_for(
                    lambda: listed(agent, "namespace") and listed(agent, "pod"),
                    "the agent's pod and namespace caches to list",
                    120,
                    on_timeout=lambda: agent.log.read_text()[-5000:],
                )
                time.sleep(SETTLE_SECONDS)
                yield agent
                agent.stop()
        finally:
            for path in sorted(run_dir.glob("*")):
                path.unlink(missing_ok=True)
            if run_dir.exists():
                run_dir.rmdir()


def memory(agent: RunningAgent) -> Memory:
    status = Path(f"/proc/{agent.proc.pid}/status").read_text()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if "kB" in line}
    return Memory(kib["VmRSS"] / 1024, kib["VmHWM"] / 1024)


def log_records(agent: RunningAgent) -> list[dict[str, Any]]:
    records = []
    for line in agent.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def listed(agent: RunningAgent, kind: str) -> dict[str, Any] | None:
    """The agent's first `<kind> cache listed` record, once it logged one."""
    if agent.proc.poll() is not None:
        raise AssertionError(f"agent exited {agent.proc.returncode}:\n{agent.log.read_text()}")
    return next((r for r in log_records(agent) if r.get("msg") == f"{kind} cache listed"), None)


def audit_events(plane: ControlPlane) -> list[dict[str, Any]]:
    lines = plane.audit_log.read_text().splitlines() if plane.audit_log.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def grant_agent(api: Any) -> None:
    """The agent's ServiceAccount with the rights its features use (the chart's ClusterRole's
    for pods, namespaces, nodes and events)."""
    core: Any = k8s.CoreV1Api(api)
    rbac: Any = k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": AGENT_NAMESPACE}})
    core.create_namespaced_service_account(AGENT_NAMESPACE, {"metadata": {"name": AGENT_ACCOUNT}})
    rbac.create_cluster_role({"metadata": {"name": "scale-agent"}, "rules": AGENT_RIGHTS})
    role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scale-agent"}
    subject = {"kind": "ServiceAccount", "name": AGENT_ACCOUNT, "namespace": AGENT_NAMESPACE}
    rbac.create_cluster_role_binding(
        {"metadata": {"name": "scale-agent"}, "roleRef": role, "subjects": [subject]}
    )


@pytest.fixture(scope="session")
def loaded_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedApi]:
    """The control plane, the agent's baseline memory on it, then NAMESPACES namespaces and
    PODS pods of other nodes; stopped and removed at the end of the session."""
    workdir = tmp_path_factory.mktemp("scale")
    network = NodeNetwork()
    plane: ControlPlane | None = None
    core = None
    try:
        network.create()
        plane = ControlPlane(
            workdir / "controlplane",
            Binaries.from_cache(),
            address=network.gateway,
            audit_policy=AUDIT_POLICY,
            etcd_fsync=False,
        )
        plane.start()
        core = new_core(str(plane.kubeconfig))
        register_node(core, NODE, address=network.node_ip)
        grant_agent(core.api_client)
        identity = service_account_identity(
            core,
            namespace=AGENT_NAMESPACE,
            service_account=AGENT_ACCOUNT,
            server=plane.server,
            ca_file=plane.ca_file,
            path=workdir / "agent.kubeconfig",
        )
        own = NodePods(core, NODE)
        for i in range(OWN_PODS):
            own.create("default", f"own-{i}", **SIDECAR)
        bed = LoadedApi(network, plane, identity, workdir)
        with bed.run_agent() as agent:
            bed.baseline = memory(agent)
        bed.loaded = apiload.load_cluster(plane, namespaces=NAMESPACES, pods=PODS)
        print(f"baseline {bed.baseline}; loaded {bed.loaded}")
        yield bed
    except PartFailedError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        if core is not None:
            core.api_client.close()
        if plane is not None:
            plane.stop()
        network.delete()
