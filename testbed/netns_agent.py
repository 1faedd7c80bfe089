"""`istio-cni-agent run` as a real process in a node network namespace of its own, with ambient
on, a control plane it reaches over the node's veth, sidecar pods bound to its node, the ztunnel
test double on its ZDS socket, and CNI ADDs sent through its pod socket as the plugin sends them.

For tests and benchmarks that load the agent from outside (tests/hostile, bench/flood.py). The
node netns keeps what ambient programs on the "host" (probe rules, address set) off the
machine's own; the HTTP port listens on the node's veth address, which the root namespace
reaches, as a pod or Prometheus reaches a node's; kubelet's probes come from inside the node netns
(the node's own address), as on a node. Pod sockets are files, reached from anywhere.

    bed = NetnsAgentBed(workdir); bed.start(); bed.add(); ...; bed.stop()  (always stop)
"""

from __future__ import annotations

import contextlib
import http.client
import os
import secrets
import shutil
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.netns import run_in_netns
from plugin import wire
from plugin.client import AgentClient
from plugin.errors import CniError
from testbed import netns
from testbed.agent_host import RunningAgent, agent_command, make_node, running_agent
from testbed.controlplane import Binaries, ControlPlane
from testbed.node import NodePods, new_core, register_node
from testbed.nodenet import NodeNetwork
from testbed.wait import wait_for
from testbed.ztunnel_double import ZtunnelDouble, api_identity

NODE = "flood-node"
METRICS_PORT = 15014  # the node netns is the agent's own: the chart's default port is free
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    "containers": [
        {"name": "app", "image": "registry.invalid/app:1"},
        {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
    ],
}
PROBE_TIMEOUT = 1.0  # kubelet's default timeoutSeconds
PRIMARY = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}


class NetnsAgentBed:
    def __init__(self, workdir: Path, *, pods: int = 10, sandboxes: int = 30) -> None:
        self.workdir = workdir
        self.pod_count = pods
        self.sandbox_count = sandboxes
        self.network = NodeNetwork()
        self.plane: ControlPlane | None = None
        self.core: Any = None
        self.node_pods: NodePods | None = None
        self.pods: list[dict[str, Any]] = []
        self.netns: list[str] = []
        self.run_dir = Path("/tmp") / f"nsagent-{secrets.token_hex(4)}"
        self.ztunnel: ZtunnelDouble | None = None
        self.agent: RunningAgent | None = None
        self._stack = contextlib.ExitStack()
        self._adds = 0

    # --- set-up

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.network.create()
        self.plane = ControlPlane(
            self.workdir / "controlplane", Binaries.from_cache(), address=self.network.gateway
        )
        self.plane.start()
        self.core = new_core(str(self.plane.kubeconfig))
        register_node(self.core, NODE, address=self.network.node_ip)
        namespace = f"flood-{secrets.token_hex(3)}"
        self.core.create_namespace({"metadata": {"name": namespace}})
        self.node_pods = NodePods(self.core, NODE)
        self.pods = [
            self.node_pods.create(namespace, f"web-{i}", **SIDECAR) for i in range(self.pod_count)
        ]
        for _ in range(self.sandbox_count):
            name = netns.unique_name("flood-pod")
            netns.add(name)
            self.netns.append(name)
        self.agent = self._stack.enter_context(self._run_agent())
        wait_for(self._ready, "the agent's pod server to report ready", 60, on_timeout=self.logs)
        self.ztunnel = ZtunnelDouble(self.zds_socket, identity=api_identity(self.core))
        self.ztunnel.connect()
        self.ztunnel.wait_for("the snapshot", lambda z: z.snapshots == 1)

    def _run_agent(self) -> contextlib.AbstractContextManager[RunningAgent]:
        (self.workdir / "node").mkdir(parents=True)
        node = make_node(self.workdir / "node")
        node.write_primary(PRIMARY)
        config = node.write_config_yaml(
            metricsAddress=self.network.node_ip,
            metricsPort=METRICS_PORT,
            cniAgentRunDir=str(self.run_dir),
            uninstallOnStop="never",
            hostProcDir="/proc",
            mountedNetnsDir=str(netns.NETNS_DIR),
            cniNetnsDir=str(netns.NETNS_DIR),  # where the pods' namespaces are (readiness)
            excludeNamespaces=["kube-system"],
            repair={"enabled": False},
            ambient={"enabled": True, "ipv6": False, "ztunnelSocketPath": self.zds_socket},
        )
        command = [*self.network.nsenter(), *agent_command("run", "--config", str(config))]
        assert self.plane is not None
        return running_agent(command, KUBECONFIG=str(self.plane.kubeconfig), NODE_NAME=NODE)

    def _ready(self) -> bool:
        assert self.agent is not None
        if self.agent.proc.poll() is not None:
            raise RuntimeError(f"agent exited {self.agent.proc.returncode}:\n{self.logs()}")
        try:
            if not self.client().status()["ready"]:
                return False
        except CniError:
            return False
        try:  # every service, ambient's ZDS server too
            return self.probe("/readyz")[0] == 200
        except OSError:
            return False

    def http_get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET on the agent's HTTP port, from the machine's side of the node's veth."""
        conn = http.client.HTTPConnection(*self.http_address, timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def probe(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET on the agent's HTTP port as kubelet probes it: from the node's own address (a
        thread in the node netns), which no pod and no neighbour on the machine's side has, so
        the port's request budget keeps its probes apart from theirs (agent.serving.budget)."""
        return run_in_netns(self.network.netns_path, lambda: self.http_get(path, timeout))

    # --- what tests and benchmarks use

    @property
    def zds_socket(self) -> str:
        return str(self.run_dir / "ztunnel.sock")

    @property
    def pod_socket(self) -> str:
        return wire.socket_path(str(self.run_dir))

    @property
    def http_address(self) -> tuple[str, int]:
        return self.network.node_ip, METRICS_PORT

    def client(self) -> AgentClient:
        return AgentClient(str(self.run_dir), timeout=10.0)

    def warm(self) -> None:
        """One ADD into every sandbox netns, so that every later ADD re-applies alike."""
        for _ in self.netns:
            _, error = self.add()
            if error is not None:
                raise RuntimeError(f"warm-up ADD failed: {error}\n{self.logs()}")

    def measure(self, adds: int) -> Phase:
        return measure(self, adds)

    def add(self) -> tuple[float, str | None]:
        """One CNI ADD for the next pod into the next sandbox netns, through the pod socket as
        the plugin sends it: (milliseconds, None) or (milliseconds, why it failed)."""
        self._adds += 1
        pod = self.pods[self._adds % len(self.pods)]
        meta = pod["metadata"]
        request = wire.cni_request(
            command="ADD",
            container_id=uuid.uuid4().hex,
            netns=str(netns.NETNS_DIR / self.netns[self._adds % len(self.netns)]),
            ifname="eth0",
            pod_name=meta["name"],
            pod_namespace=meta["namespace"],
            pod_uid=meta["uid"],
            cni_version="1.0.0",
            prev_result=None,
        )
        began = time.perf_counter()
        try:
            reply = self.client().cni("ADD", request)
        except CniError as e:
            return (time.perf_counter() - began) * 1000, f"{e.code} {e.msg}: {e.details}"
        ms = (time.perf_counter() - began) * 1000
        if reply["result"] != wire.RESULT_REDIRECTED:
            return ms, f"not redirected: {reply}"
        return ms, None

    def threads_and_fds(self) -> tuple[int, int]:
        """The agent process's thread count and open descriptors, from /proc."""
        assert self.agent is not None
        pid = self.agent.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        line = next(ln for ln in status.splitlines() if ln.startswith("Threads:"))
        threads = int(line.split()[1])
        return threads, len(os.listdir(f"/proc/{pid}/fd"))

    def logs(self) -> str:
        if self.agent is None or not self.agent.log.exists():
            return ""
        return self.agent.log.read_text(errors="replace")[-20000:]

    # --- clean-up

    def stop(self) -> None:
        ztunnel, self.ztunnel = self.ztunnel, None
        if ztunnel is not None:
            ztunnel.strict = False  # checked last, once everything else is gone
            ztunnel.close()
        if self.agent is not None and self.agent.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.agent.stop()
        self._stack.close()
        self.agent = None
        for name in self.netns:
            netns.delete(name)
        self.netns.clear()
        if self.node_pods is not None:
            with contextlib.suppress(Exception):
                self.node_pods.close()
            self.node_pods = None
        if self.core is not None:
            self.core.api_client.close()
            self.core = None
        if self.plane is not None:
            self.plane.stop()
            self.plane = None
        with contextlib.suppress(RuntimeError):  # the veth's root end went with the netns
            self.network.delete()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if ztunnel is not None:
            ztunnel.assert_no_violations()


@dataclass
class Phase:
    """One run of sequential ADDs: each one's milliseconds and failures, the agent's highest
    thread and descriptor counts seen meanwhile, and each liveness probe's milliseconds."""

    samples: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    threads: int = 0
    fds: int = 0
    probes: list[float] = field(default_factory=list)
    probe_failures: list[str] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples)
        return ordered[round(0.99 * (len(ordered) - 1))]

    def __str__(self) -> str:
        return (
            f"p50 {self.p50:.1f} ms p99 {self.p99:.1f} ms, "
            f"threads {self.threads} fds {self.fds}, probe max {max(self.probes):.0f} ms"
        )


def measure(bed: NetnsAgentBed, adds: int) -> Phase:
    """`adds` ADDs one after another while the agent's threads and descriptors and kubelet's
    liveness probe (/healthz within 1 s) are watched from another thread."""
    phase = Phase()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            threads, fds = bed.threads_and_fds()
            phase.threads, phase.fds = max(phase.threads, threads), max(phase.fds, fds)
            began = time.perf_counter()
            try:
                status, _ = bed.probe("/healthz", timeout=PROBE_TIMEOUT)
                if status != 200:
                    phase.probe_failures.append(f"status {status}")
            except OSError as e:
                phase.probe_failures.append(repr(e))
            phase.probes.append((time.perf_counter() - began) * 1000)
            done.wait(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(adds):
            ms, error = bed.add()
            phase.samples.append(ms)
            if error is not None:
                phase.failures.append(error)
    finally:
        done.set()
        watcher.join()
    return phase
