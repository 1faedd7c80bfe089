"""ADD latency as the container runtime sees it: exec of the installed plugin to its result.

    cd REPO && /root/.pyenv/versions/3.11.7/bin/python3 -m bench.add_latency \
        [--sequential 200] [--concurrent 110] [--startup 200] [--backend auto]

What runs (root; after ci/setup-testbed, so the control plane binaries are cached):
- the test bed's control plane (etcd, kube-apiserver, kube-controller-manager) and a Node;
- sidecar pods (annotation sidecar.istio.io/status, an istio-proxy container) created through
  the API, bound to that node, before the agent starts (its pod cache lists them);
- `istio-cni-agent run` as a real process, started as its DaemonSet runs it (tests/e2e/daemon.py:
  own mount namespace with /host/... binds), with the chart's default settings except the
  paths, the metrics port and uninstallOnStop=never; it installs the plugin built by
  ci/build-plugin into a temp CNI bin dir and chains it into a bridge + portmap conflist;
- per ADD a fresh pod netns (lo up; eth0 a veth, its peer left inside, holding the pod's IPv4
  address: what the bridge plugin leaves for the next link of the chain), made before the
  clock starts.

What is timed: one exec of the installed `istio-cni` binary with the CNI_* environment and the
chained config on stdin (our entry from the conflist, cniVersion 1.0.0, a prevResult as bridge
returns it) until it exited, i.e. plugin start-up + request over the agent's socket + pod lookup
in the cache + decision + host facts + rules applied in the netns + reply. Every exec must exit
0 with the prevResult on stdout; afterwards (untimed) every netns is checked to hold exactly the
pod's rules. Sequential: one ADD after another (5 untimed warm-up ADDs first). Concurrent: all
ADDs released at once from a barrier; the wall time is from release until the last exited.
Start-up: the same binary with CNI_COMMAND=VERSION (no agent round trip). The agent's own time
per ADD is read from its latency histogram on /metrics (sum / count for the phase).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.rules.sidecar.apply import host_facts, rules_present
from agent.rules.sidecar.pod import capture_config_for_pod
from bench.quiet import wait_quiet
from testbed.controlplane import Binaries, ControlPlane
from testbed.daemon import DaemonAgent, NodeDirs, cleanup_host_root, start_daemon_agent
from testbed.node import new_core, pod_manifest, register_node
from testbed.ports import free_port

REPO = Path(__file__).resolve().parents[1]
NODE = "bench-node"
NAMESPACE = "default"
SUBNET_PREFIX = "10.251"
SIDECAR = {
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    "containers": [
        {"name": "app", "image": "registry.invalid/app:1"},
        {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
    ],
}


@dataclass(frozen=True)
class Sandbox:
    pod: dict[str, Any]
    netns: str
    address: str
    container_id: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: list[float]) -> str:
    return (
        f"n={len(samples)} p50 {statistics.median(samples):6.1f} ms  "
        f"p99 {percentile(samples, 0.99):6.1f} ms  mean {statistics.fmean(samples):6.1f} ms  "
        f"max {max(samples):6.1f} ms"
    )


class Bench:
    def __init__(self, workdir: Path, backend: str) -> None:
        self.workdir = workdir
        self.backend = backend
        self.bin_dir = workdir / "node" / "bin"
        self.conf_dir = workdir / "node" / "net.d"
        self.build_dir = workdir / "build"
        self.netns: list[str] = []
        self.agent: DaemonAgent | None = None
        self.plane: ControlPlane | None = None
        self.core: Any = None
        self.count = 0

    # -- set-up ---------------------------------------------------------------------------
    def start(self, pods_needed: int) -> None:
        subprocess.run(
            [str(REPO / "ci" / "build-plugin"), str(self.build_dir)],
            check=True,
            capture_output=True,
        )
        self.plane = ControlPlane(self.workdir / "controlplane", Binaries.from_cache())
        self.plane.start()
        self.core = new_core(str(self.plane.kubeconfig))
        register_node(self.core, NODE)
        self.pods = [self._create_pod(i) for i in range(pods_needed)]
        self._start_agent()

    def _create_pod(self, i: int) -> dict[str, Any]:
        body = pod_manifest(f"bench-{i}", NODE, **SIDECAR)  # type: ignore[arg-type]
        for _ in range(100):  # a new control plane makes the default ServiceAccount soon
            try:
                pod = self.core.create_namespaced_pod(NAMESPACE, body)
                return dict(self.core.api_client.sanitize_for_serialization(pod))
            except Exception as e:  # retried while the ServiceAccount is missing, else raised
                if "serviceaccount" not in str(e):
                    raise
                time.sleep(0.2)
        raise RuntimeError("default ServiceAccount never appeared")

    def _start_agent(self) -> None:
        for d in (self.bin_dir, self.conf_dir):
            d.mkdir(parents=True)
        # The primary's plugins, as its installer leaves a node (the agent's cni-bin-dir
        # readiness check looks for them); the bench calls only istio-cni.
        for plugin in ("bridge", "portmap"):
            (self.bin_dir / plugin).touch()
        self.conf_dir.joinpath("10-bench.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "bench",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "benchbr0",
                            "isGateway": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": "10.251.0.0/16"}]],
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        self.metrics_port = free_port()
        config = {
            "cniAgentRunDir": str(self.workdir / "run"),
            "metricsPort": self.metrics_port,
            "metricsAddress": "127.0.0.1",
            "uninstallOnStop": "never",
            "ruleBackend": self.backend,
        }
        assert self.plane is not None
        self.agent = start_daemon_agent(
            config_yaml=json.dumps(config),
            node=NodeDirs(self.bin_dir, self.conf_dir),
            plugin_build=self.build_dir,
            kubeconfig=self.plane.kubeconfig,
            node_name=NODE,
            pod_name="istio-cni-bench",
            pod_namespace="istio-system",
            workdir=self.workdir / "agent",
        )
        self.agent.wait_ready()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the plugin's STATUS: cache listed, plugin in
            installed = (
                self.bin_dir / "istio-cni"
            ).exists() and "istio-cni" in self.conf_dir.joinpath("10-bench.conflist").read_text()
            status = {**self.entry(), "cniVersion": "1.1.0"} if installed else {}
            if installed and self.exec_plugin("STATUS", None, status)[0] == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"plugin STATUS never ready:\n{self.agent.logs()}")

    def entry(self) -> dict[str, Any]:
        conflist = json.loads(self.conf_dir.joinpath("10-bench.conflist").read_text())
        ours = [p for p in conflist["plugins"] if p["type"] == "istio-cni"]
        return {**ours[0], "cniVersion": conflist["cniVersion"], "name": conflist["name"]}

    def sandboxes(self, pods: list[dict[str, Any]]) -> list[Sandbox]:
        """One fresh pod netns per pod, as the bridge plugin leaves it for the next link."""
        out = []
        for pod in pods:
            self.count += 1
            name = f"icni-add-{uuid.uuid4().hex[:8]}"
            address = f"{SUBNET_PREFIX}.{self.count // 250}.{self.count % 250 + 2}"
            subprocess.run(["ip", "netns", "add", name], check=True)
            self.netns.append(name)
            batch = (
                "link set lo up\nlink add eth0 type veth peer name peer0\n"
                f"addr add {address}/16 dev eth0\nlink set eth0 up\n"
            )
            subprocess.run(["ip", "-n", name, "-batch", "-"], input=batch, text=True, check=True)
            out.append(Sandbox(pod, name, address, uuid.uuid4().hex * 2))
        return out

    # -- the timed exec -------------------------------------------------------------------
    def exec_plugin(
        self, command: str, sandbox: Sandbox | None, conf: dict[str, Any]
    ) -> tuple[int, str, float]:
        env = {"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir), "PATH": "/usr/bin:/bin"}
        if sandbox is not None:
            meta = sandbox.pod["metadata"]
            env.update(
                {
                    "CNI_CONTAINERID": sandbox.container_id,
                    "CNI_NETNS": sandbox.path,
                    "CNI_IFNAME": "eth0",
                    "CNI_ARGS": (
                        f"IgnoreUnknown=1;K8S_POD_NAMESPACE={meta['namespace']};"
                        f"K8S_POD_NAME={meta['name']};"
                        f"K8S_POD_INFRA_CONTAINER_ID={sandbox.container_id};"
                        f"K8S_POD_UID={meta['uid']}"
                    ),
                }
            )
        stdin = json.dumps(conf or self.entry()).encode()
        start = time.perf_counter()
        done = subprocess.run(
            [str(self.bin_dir / "istio-cni")],
            input=stdin,
            env=env,
            capture_output=True,
            check=False,
        )
        elapsed = (time.perf_counter() - start) * 1000
        return done.returncode, done.stdout.decode() + done.stderr.decode()[-500:], elapsed

    def add(self, sandbox: Sandbox, entry: dict[str, Any]) -> tuple[bool, float, str]:
        prev = {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "benchbr0", "mac": "0a:58:0a:fb:00:01"},
                {"name": "eth0", "mac": "0a:58:0a:fb:00:02", "sandbox": sandbox.path},
            ],
            "ips": [{"address": f"{sandbox.address}/16", "gateway": "10.251.0.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.251.0.1"}],
            "dns": {},
        }
        code, out, ms = self.exec_plugin("ADD", sandbox, {**entry, "prevResult": prev})
        ok = code == 0 and json.loads(out.split("\n", 1)[0] or "{}").get("ips") == prev["ips"]
        return ok, ms, out

    def agent_add_seconds(self) -> tuple[float, float]:
        """(sum, count) of the agent's ADD latency histogram."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        values = {}
        metric = "istio_cni_plugin_request_duration_seconds"
        for line in text.splitlines():
            for key in ("_sum", "_count"):
                if line.startswith(f'{metric}{key}{{command="add"}}'):
                    values[key] = float(line.split()[-1])
        return values.get("_sum", 0.0), values.get("_count", 0.0)

    def verify(self, sandboxes: list[Sandbox]) -> int:
        """How many netns do not hold exactly the pod's rules (untimed)."""
        bad = 0
        for sb in sandboxes:
            ipv6, dns = host_facts(sb.path)
            config = capture_config_for_pod(sb.pod, ipv6=ipv6, dns_servers=dns)
            if not rules_present(sb.path, config, backend=self.backend):
                bad += 1
        return bad

    # -- clean-up -------------------------------------------------------------------------
    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        cleanup_host_root()
        for name in self.netns:
            subprocess.run(["ip", "netns", "del", name], check=False)
        if self.core is not None:
            self.core.api_client.close()
        if self.plane is not None:
            self.plane.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def run_sequential(bench: Bench, n: int) -> None:
    entry = bench.entry()
    warm = bench.sandboxes(bench.pods[:5])
    for sb in warm:
        bench.add(sb, entry)
    sandboxes = bench.sandboxes(bench.pods[5 : 5 + n])
    before = bench.agent_add_seconds()
    samples, failures = [], []
    for sb in sandboxes:
        ok, ms, out = bench.add(sb, entry)
        samples.append(ms)
        if not ok:
            failures.append(out)
    after = bench.agent_add_seconds()
    agent_ms = (after[0] - before[0]) / max(after[1] - before[1], 1) * 1000
    print(f"sequential ADD        {summary(samples)}  failures {len(failures)}")
    print(f"  agent's share       mean {agent_ms:6.1f} ms (latency histogram)")
    print(f"  netns without the pod's exact rules: {bench.verify(sandboxes)}")
    for out in failures[:3]:
        print("  failure:", out.strip()[:300])


def process_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def run_concurrent(bench: Bench, n: int, offset: int) -> None:
    entry = bench.entry()
    sandboxes = bench.sandboxes(bench.pods[offset : offset + n])
    barrier = threading.Barrier(n + 1)
    results: list[tuple[bool, float, str]] = [(False, 0.0, "")] * n
    ended: list[float] = [0.0] * n

    def one(i: int) -> None:
        barrier.wait()
        results[i] = bench.add(sandboxes[i], entry)
        ended[i] = time.perf_counter()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    busy = wait_quiet(window=2.0, timeout=60.0)
    before = bench.agent_add_seconds()
    assert bench.agent is not None
    agent_pid = bench.agent.proc.pid
    agent0, children0 = process_cpu(agent_pid)
    plugins0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    barrier.wait()
    released = time.perf_counter()
    for t in threads:
        t.join()
    wall = max(ended) - released
    agent1, children1 = process_cpu(agent_pid)
    plugins1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    after = bench.agent_add_seconds()
    failures = [out for ok, _, out in results if not ok]
    agent_ms = (after[0] - before[0]) / max(after[1] - before[1], 1) * 1000
    print(
        f"concurrent {n} ADDs    all done in {wall * 1000:7.1f} ms  failures {len(failures)}"
        f"  (CPU busy {busy:.0%} before)"
    )
    print(f"  per ADD             {summary([ms for _, ms, _ in results])}")
    print(f"  agent's share       mean {agent_ms:6.1f} ms (latency histogram)")

    def cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)

    print(
        f"  CPU s               plugins {cpu(plugins0, plugins1):.2f}, agent {agent1 - agent0:.2f}"
        f" + its rule processes {children1 - children0:.2f}, bench {cpu(self0, self1):.2f}"
        f" (2 cores: {2 * wall:.2f} core-s in the wall time)"
    )
    print(f"  netns without the pod's exact rules: {bench.verify(sandboxes)}")
    for out in failures[:3]:
        print("  failure:", out.strip()[:300])


def run_startup(bench: Bench, n: int) -> None:
    samples = []
    for i in range(n + 5):
        code, out, ms = bench.exec_plugin("VERSION", None, {"cniVersion": "1.0.0"})
        if code != 0:
            raise RuntimeError(f"VERSION failed: {out}")
        if i >= 5:
            samples.append(ms)
    print(f"plugin start-up       {summary(samples)}  (CNI_COMMAND=VERSION)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=110)
    parser.add_argument("--startup", type=int, default=200)
    parser.add_argument("--backend", default="auto")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/add_latency.py needs root (network namespaces, mounts)")
    bench = Bench(Path(tempfile.mkdtemp(prefix="istio-cni-add-bench-")), opts.backend)
    print(
        f"python {sys.version.split()[0]}, backend {opts.backend}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    try:
        bench.start(5 + opts.sequential + opts.concurrent)
        run_startup(bench, opts.startup)
        run_sequential(bench, opts.sequential)
        run_concurrent(bench, opts.concurrent, 5 + opts.sequential)
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
