"""A full node at once: on the test bed's real node (kubelet + containerd, testbed/realnode.py),
two Deployments (sidecar pods and plain pods, half each) scaled from 0 to N together, with the
chart installed and without it, alternating in one run.

Per burst (a namespace of its own, removed after):
- all Ready: seconds from the scale-up until every pod is Ready (the API's Ready condition);
- RunPodSandbox: containerd's own time per sandbox (its log lines at the call and its return;
  the CNI chain runs inside), p50/p99 over the bursts of the case;
- with the chart: the agent's RSS (the highest of samples every 0.1 s) and its CPU seconds
  (utime + stime from /proc) from the scale-up until all Ready;
- failures: pods not Ready within the timeout, and sidecar pods whose network namespace does not
  hold exactly their rules (checked untimed after the burst; an ADD that failed and was retried
  by kubelet is not a failure, one that never succeeded leaves its pod not Ready).

Run as root from the repository root, after ci/setup-testbed, ci/build-testbed-images and
ci/build-image (under the heavy lock):
    .venv/bin/python -m bench.node_scale --pods 110 [--rounds 2] [--json]
With --json the last line is one JSON object (contract in DESIGN.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.rules.sidecar.apply import host_facts, rules_present
from agent.rules.sidecar.pod import capture_config_for_pod
from bench.node_start import percentile, sandbox_times
from bench.quiet import wait_quiet
from testbed import kubepods
from testbed.chart import (
    AGENT_CONTAINER,
    AGENT_NAMESPACE,
    CHART,
    RELEASE,
    node_values,
    ready_agent,
    wait_agent_gone,
)
from testbed.helm import Helm
from testbed.parts import helm_binaries
from testbed.realnode import RealCluster

READY_TIMEOUT = 600.0
GONE_TIMEOUT = 300.0
SAMPLE_SECONDS = 0.1
KINDS = ("sidecar", "plain")


@dataclass
class Burst:
    ready_s: float = 0.0
    not_ready: int = 0
    uncaptured: int = 0
    sandboxes: list[float] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    cpu_s: float = 0.0
    load: float = 0.0
    busy_before: float = 0.0
    """The machine's CPU use over the quiet window before the scale-up (0-1): each burst waits
    for the previous one's teardown (bench/quiet.py)."""

    @property
    def failures(self) -> int:
        return self.not_ready + self.uncaptured


class AgentSampler:
    """The agent process's highest RSS and its CPU seconds between start() and stop()."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cpu0 = 0.0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak_kib = max(self.peak_kib, self.rss_kib())
            self._done.wait(SAMPLE_SECONDS)

    def start(self) -> None:
        self._cpu0 = self.cpu_seconds()
        self._thread.start()

    def stop(self) -> tuple[float, float]:
        """(peak RSS MiB, CPU seconds) since start()."""
        self._done.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, self.rss_kib())
        return self.peak_kib / 1024, self.cpu_seconds() - self._cpu0


def deployment(kind: str, image: str) -> dict[str, Any]:
    labels = {"app": f"scale-{kind}"}
    pod = kubepods.pod_manifest(
        "unused", image, app_command=["sleep"], sidecar=kind == "sidecar", labels=labels
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"scale-{kind}"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {k: pod["metadata"][k] for k in ("labels", "annotations")},
                "spec": pod["spec"],
            },
        },
    }


def ready_count(core: Any, namespace: str) -> tuple[int, list[dict[str, Any]]]:
    """(pods Ready, every pod as JSON), read raw: the bench's own CPU stays small."""
    reply = core.list_namespaced_pod(namespace, _preload_content=False)
    pods: list[dict[str, Any]] = json.loads(reply.data)["items"]
    ready = 0
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready += any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return ready, pods


class Bench:
    def __init__(self, cluster: RealCluster, pods: int, helm: Helm) -> None:
        self.cluster, self.pods, self.helm = cluster, pods, helm
        self.core = cluster.core()
        self.apps = cluster.apps()
        self.image = cluster.images["workload"].ref

    def burst(self, label: str, agent_pid: int | None) -> Burst:
        namespace = f"scale-{label}-{secrets.token_hex(2)}"
        self.core.create_namespace({"metadata": {"name": namespace}})
        try:
            kubepods.wait_for(
                lambda: kubepods.has_default_service_account(self.core, namespace),
                "default ServiceAccount",
                60,
            )
            for kind in KINDS:
                self.apps.create_namespaced_deployment(namespace, deployment(kind, self.image))
            return self._scale_up(namespace, agent_pid)
        finally:
            self._remove(namespace)

    def _scale_up(self, namespace: str, agent_pid: int | None) -> Burst:
        busy = wait_quiet()
        burst = Burst(load=os.getloadavg()[0], busy_before=busy)
        sampler = AgentSampler(agent_pid) if agent_pid else None
        counts = {"sidecar": self.pods // 2, "plain": self.pods - self.pods // 2}
        if sampler:
            sampler.start()
        began = time.monotonic()
        for kind, replicas in counts.items():
            self.apps.patch_namespaced_deployment_scale(
                f"scale-{kind}", namespace, {"spec": {"replicas": replicas}}
            )
        ready, pods = 0, list[dict[str, Any]]()
        while time.monotonic() - began < READY_TIMEOUT:
            ready, pods = ready_count(self.core, namespace)
            if ready >= self.pods:
                break
            time.sleep(0.25)
        burst.ready_s = time.monotonic() - began
        if sampler:
            burst.peak_rss_mib, burst.cpu_s = sampler.stop()
        burst.not_ready = self.pods - ready
        log = (self.cluster.log_dir / "containerd.log").read_text(errors="replace")
        burst.sandboxes = list(sandbox_times(log, namespace).values())
        if agent_pid:
            burst.uncaptured = self._uncaptured(pods)
        return burst

    def _uncaptured(self, pods: list[dict[str, Any]]) -> int:
        """Sidecar pods whose netns does not hold exactly their rules (untimed)."""
        missing = 0
        for pod in pods:
            if pod["metadata"]["labels"].get("app") != "scale-sidecar":
                continue
            try:
                netns = self.cluster.pod_netns(pod["metadata"]["uid"])
                ipv6, dns = host_facts(netns)
                config = capture_config_for_pod(pod, ipv6=ipv6, dns_servers=dns)
                missing += not rules_present(netns, config)
            except (AssertionError, OSError):
                missing += 1
        return missing

    def _remove(self, namespace: str) -> None:
        self.core.delete_namespace(namespace)
        kubepods.wait_for(
            lambda: not self.core.list_namespaced_pod(namespace).items,
            f"the pods of {namespace} gone",
            GONE_TIMEOUT,
        )

    def with_chart(self) -> Burst:
        image = self.cluster.images["istio-cni"]
        values = node_values(self.cluster, image, logLevel="info")
        self.helm.install(RELEASE, CHART, namespace=AGENT_NAMESPACE, values=values)
        try:
            agent = ready_agent(self.core, self.cluster, image=image)
            _, pid = self.cluster.container(agent.pod.uid, AGENT_CONTAINER)
            return self.burst("with", pid)
        finally:
            self.helm.uninstall(RELEASE, namespace=AGENT_NAMESPACE)
            wait_agent_gone(self.core)


def summary(with_chart: list[Burst], without: list[Burst]) -> dict[str, Any]:
    ready_with = statistics.median(b.ready_s for b in with_chart)
    ready_without = statistics.median(b.ready_s for b in without)
    sandboxes = [s for b in with_chart for s in b.sandboxes]
    sandboxes_without = [s for b in without for s in b.sandboxes]
    return {
        "all_ready_s": round(ready_with, 2),
        "all_ready_s_without": round(ready_without, 2),
        "all_ready_ratio": round(ready_with / ready_without, 3),
        "sandbox_p50_ms": round(statistics.median(sandboxes) * 1000, 1),
        "sandbox_p99_ms": round(percentile(sandboxes, 99) * 1000, 1),
        "sandbox_p50_ms_without": round(statistics.median(sandboxes_without) * 1000, 1),
        "sandbox_p99_ms_without": round(percentile(sandboxes_without, 99) * 1000, 1),
        "agent_peak_rss_mib": round(max(b.peak_rss_mib for b in with_chart), 1),
        "agent_cpu_s": round(max(b.cpu_s for b in with_chart), 2),
        "failures": sum(b.failures for b in with_chart),
        "failures_without": sum(b.not_ready for b in without),
        "load_average": round(statistics.fmean(b.load for b in with_chart + without), 2),
        "busy_before_max": round(max(b.busy_before for b in with_chart + without), 2),
    }


def describe(label: str, burst: Burst) -> str:
    sandboxes = burst.sandboxes or [0.0]
    agent = f", agent peak RSS {burst.peak_rss_mib:.1f} MiB, CPU {burst.cpu_s:.2f} s"
    return (
        f"{label:8s} all Ready {burst.ready_s:6.1f} s, sandbox p50 "
        f"{statistics.median(sandboxes) * 1000:6.0f} ms p99 {percentile(sandboxes, 99) * 1000:6.0f}"
        f" ms (n={len(burst.sandboxes)}), failures {burst.failures}"
        + (agent if burst.peak_rss_mib else "")
        + f", load {burst.load:.1f}, CPU busy before {burst.busy_before:.0%}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/node_scale.py needs root (a real node)")
    binary = helm_binaries()[max(helm_binaries(), key=lambda v: v.split(".")[0])]
    workdir = Path(tempfile.mkdtemp(prefix="node-scale-"))
    cluster = RealCluster(workdir, max_pods=opts.pods + 10)  # + the agent's and room
    with_chart: list[Burst] = []
    without: list[Burst] = []
    try:
        cluster.start()
        bench = Bench(
            cluster,
            opts.pods,
            Helm(binary=binary, kubeconfig=cluster.kubeconfig, home=workdir / "helm"),
        )
        for i in range(opts.rounds):
            order = ("without", "with") if i % 2 == 0 else ("with", "without")
            for case in order:
                burst = bench.with_chart() if case == "with" else bench.burst("without", None)
                (with_chart if case == "with" else without).append(burst)
                print(describe(case, burst), flush=True)
    finally:
        cluster.stop()
    result = summary(with_chart, without)
    print(json.dumps(result) if opts.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
