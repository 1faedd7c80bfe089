"""On the test bed's real node (kubelet + containerd, testbed/realnode.py):

1. `helm install` of the chart until the agent's pod is Ready (DaemonSet controller, scheduler,
   kubelet, containerd, the agent's start and readiness probe), per round;
2. pod sandbox start time with and without `istio-cni` in the CNI chain: for N plain pods and N
   sidecar pods each, the time containerd took for RunPodSandbox (its "RunPodsandbox" and
   "RunPodSandbox ... returns sandbox id" log lines; the CNI chain runs inside), p50 and p99.
   "without" is the node before the chart is installed; "with" after, for pods the agent
   redirects (sidecar) and pods it only looks at (plain).

Run as root from the repository root, after ci/setup-testbed, ci/build-testbed-images and
ci/build-image:
    .venv/bin/python -m bench.node_start [PODS] [INSTALL_ROUNDS]
"""

from __future__ import annotations

import re
import secrets
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed import kubepods
from testbed.chart import (
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

# containerd's CRI logs each RunPodSandbox call when it starts and when it returns.
SANDBOX_RE = re.compile(
    r'time="([^"]+)" level=\w+ msg="RunPodSandbox for &PodSandboxMetadata'
    r"\{Name:([^,]+),Uid:[^,]+,Namespace:([^,]+),Attempt:\d+,\}(.*)"
)


def parse_time(stamp: str) -> float:
    # containerd writes RFC 3339 with nanoseconds: keep microseconds for datetime.
    head, frac = stamp.rstrip("Z").split(".")
    return datetime.fromisoformat(f"{head}.{frac[:6]}+00:00").timestamp()


def sandbox_times(log: str, namespace: str) -> dict[str, float]:
    """pod name -> seconds containerd spent in its first successful RunPodSandbox."""
    started: dict[str, float] = {}
    took: dict[str, float] = {}
    for line in log.splitlines():
        m = SANDBOX_RE.search(line)
        if not m or m.group(3) != namespace:
            continue
        stamp, name, rest = parse_time(m.group(1)), m.group(2), m.group(4)
        if rest.startswith('"'):  # the call begins
            started[name] = stamp
        elif "returns sandbox id" in rest and name in started:
            took.setdefault(name, stamp - started[name])
    return took


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run_pods(cluster: RealCluster, core: Any, label: str, count: int, sidecar: bool) -> list[float]:
    namespace = f"bench-{label}-{secrets.token_hex(2)}"
    core.create_namespace({"metadata": {"name": namespace}})
    kubepods.wait_for(
        lambda: core.list_namespaced_service_account(namespace).items, "default ServiceAccount", 30
    )
    image = cluster.images["workload"].ref
    try:
        # Sequentially: the time of one sandbox, not of a queue of them on 2 cores.
        for i in range(count):
            name = f"p{i:03d}"
            core.create_namespaced_pod(
                namespace,
                kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=sidecar),
            )
            kubepods.wait_running(core, namespace, name, timeout=120, ready=False)
        times = sandbox_times((cluster.log_dir / "containerd.log").read_text(), namespace)
        if len(times) < count:
            raise RuntimeError(f"{label}: containerd logged {len(times)} of {count} sandboxes")
        return list(times.values())
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)
        kubepods.wait_for(
            lambda: not core.list_namespaced_pod(namespace).items, f"pods of {namespace} gone", 300
        )
        core.delete_namespace(namespace)


def summary(label: str, values: list[float]) -> str:
    return (
        f"{label:34s} p50 {statistics.median(values) * 1000:7.1f} ms  "
        f"p99 {percentile(values, 99) * 1000:7.1f} ms  n={len(values)}"
    )


def main() -> int:
    pods = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    helm_binary = helm_binaries()[max(helm_binaries(), key=lambda v: v.split(".")[0])]
    workdir = Path(tempfile.mkdtemp(prefix="node-bench-"))
    cluster = RealCluster(workdir)
    began = time.monotonic()
    try:
        cluster.start()
        print(
            f"node start to Ready: {time.monotonic() - began:.1f}s "
            + " ".join(f"{k}={v:.1f}s" for k, v in cluster.timings.items()),
            flush=True,
        )
        core = cluster.core()
        image = cluster.images["istio-cni"]
        results = {"without istio-cni": run_pods(cluster, core, "without", pods, False)}
        helm = Helm(binary=helm_binary, kubeconfig=cluster.kubeconfig, home=workdir / "helm")
        installs = []
        for i in range(rounds):
            t0 = time.monotonic()
            helm.install(
                RELEASE,
                CHART,
                namespace=AGENT_NAMESPACE,
                values=node_values(cluster, image, logLevel="info"),
            )
            ready_agent(core, cluster, image=image)
            installs.append(time.monotonic() - t0)
            print(f"helm install -> agent Ready, round {i + 1}: {installs[-1]:.2f}s", flush=True)
            if i < rounds - 1:
                helm.uninstall(RELEASE, namespace=AGENT_NAMESPACE)
                wait_agent_gone(core)
        results["with istio-cni, plain pods"] = run_pods(cluster, core, "plain", pods, False)
        results["with istio-cni, sidecar pods"] = run_pods(cluster, core, "sidecar", pods, True)
        helm.uninstall(RELEASE, namespace=AGENT_NAMESPACE)
        wait_agent_gone(core)
        print(
            f"helm install -> agent Ready: median {statistics.median(installs):.2f}s "
            f"min {min(installs):.2f}s max {max(installs):.2f}s (n={rounds})"
        )
        print("RunPodSandbox (containerd, CNI chain inside):")
        for label, values in results.items():
            print("  " + summary(label, values))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
