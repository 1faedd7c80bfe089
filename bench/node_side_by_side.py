"""Istio's node agent and ours on the same real node (testbed/realnode.py: kubelet + containerd),
in one run, alternating: the same sidecar pods started with no Istio CNI at all, under Istio's
DaemonSet (its chart from tests/testdata/istio-chart, its `install-cni` image built by
ci/build-testbed-images) and under ours (the chart, our image).

    .venv/bin/python -m bench.node_side_by_side [--pods 30] [--rounds 3] [--json]

Each round runs the three cases in a rotated order; each case installs its agent (Helm 4, log
level info, repair off on both: nothing but the ADD path is timed), waits for it Ready, starts
its share of the pods one at a time, then `--extra` more pods while the plugin's peak memory is
read (bench/exec_peak.py; those pods are not timed), and uninstalls.

- RunPodSandbox: containerd's own time per sandbox (its log; the CNI chain runs inside).
  Overhead = p50 (p99) with the agent's plugin minus p50 (p99) with no Istio CNI.
- agent_peak_rss_mib: the agent process's VmHWM (its high-water mark since it started, start-up
  included) when its last pod ran; the largest over the rounds.
- plugin_peak_rss_mib: per plugin ADD, its own process's VmHWM (children such as
  iptables-restore not counted); p50 and the largest. Runs seen, by CNI_COMMAND, are counted
  in plugin_runs_measured_<case>.

The last line printed is one JSON object (with --json, the only output on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.exec_peak import ExecPeaks, high_water_kib
from bench.node_start import percentile, sandbox_times
from testbed import chart as agent_mod
from testbed import images, istio_agent, kubepods
from testbed.helm import Helm
from testbed.parts import helm_binaries
from testbed.realnode import RealCluster

CASES = ("none", "istio", "ours")
EXTRA = 5


@dataclass
class Case:
    sandboxes: list[float] = field(default_factory=list)
    agent_hwm_kib: list[int] = field(default_factory=list)
    plugin_kib: list[int] = field(default_factory=list)
    plugin_commands: dict[str, int] = field(default_factory=dict)


class SideBySide:
    def __init__(self, cluster: RealCluster, helm: Helm, log: Any) -> None:
        self.cluster, self.helm, self.log = cluster, helm, log
        self.core = cluster.core()
        self.image = cluster.images["workload"].ref
        self.ours = cluster.images["istio-cni"]
        self.istio = images.image("install-cni")
        cluster.import_image(self.istio)
        self.before = cluster.conflist_path.read_bytes()
        self.results = {case: Case() for case in CASES}

    def run(self, case: str, pods: int, extra: int) -> None:
        result = self.results[case]
        pid = self._install(case)
        try:
            namespace = self._namespace(case)
            try:
                self._pods(namespace, 0, pods)
                log = (self.cluster.log_dir / "containerd.log").read_text(errors="replace")
                times = sandbox_times(log, namespace)
                if len(times) < pods:
                    raise RuntimeError(f"{case}: containerd logged {len(times)} of {pods}")
                result.sandboxes += times.values()
                if pid is not None:
                    hwm = high_water_kib(pid)
                    if hwm is None:
                        raise RuntimeError(f"{case}: the agent process {pid} is gone")
                    result.agent_hwm_kib.append(hwm)
                    plugin = str(self.cluster.cni_bin_dir / "istio-cni")
                    with ExecPeaks(plugin) as peaks:
                        self._pods(namespace, pods, extra)
                        time.sleep(0.5)
                    result.plugin_kib += peaks.by_command.get("ADD", [])
                    for command, runs in peaks.by_command.items():
                        result.plugin_commands[command] = result.plugin_commands.get(
                            command, 0
                        ) + len(runs)
            finally:
                self._remove(namespace)
        finally:
            self._uninstall(case)

    def _install(self, case: str) -> int | None:
        """Install the case's agent; its process's pid (None: no agent)."""
        if case == "none":
            return None
        if case == "istio":
            view = istio_agent.install(
                self.helm,
                self.cluster,
                self.core,
                self.istio,
                repair={"enabled": False},
                logging={"level": "info"},
            )
            return self.cluster.container(view.uid, istio_agent.CONTAINER)[1]
        agent = agent_mod.install(
            self.helm,
            self.cluster,
            self.core,
            self.ours,
            logLevel="info",
            repair={"enabled": False},
        )
        return self.cluster.container(agent.pod.uid, agent_mod.AGENT_CONTAINER)[1]

    def _uninstall(self, case: str) -> None:
        if case == "istio":
            istio_agent.uninstall(self.helm, self.core)
        elif case == "ours":
            agent_mod.uninstall(self.helm, self.core)
        # Istio's clean-up rewrites the conflist (keys sorted): every case starts from the same.
        self.cluster.conflist_path.write_bytes(self.before)

    def _namespace(self, case: str) -> str:
        namespace = f"sbs-{case}-{secrets.token_hex(2)}"
        self.core.create_namespace({"metadata": {"name": namespace}})
        kubepods.wait_for(
            lambda: kubepods.has_default_service_account(self.core, namespace),
            "default ServiceAccount",
            60,
        )
        return namespace

    def _pods(self, namespace: str, first: int, count: int) -> None:
        # One at a time: the time of one sandbox, not of a queue of them on a small node.
        for i in range(first, first + count):
            name = f"p{i:03d}"
            manifest = kubepods.pod_manifest(name, self.image, app_command=["sleep"], sidecar=True)
            self.core.create_namespaced_pod(namespace, manifest)
            kubepods.wait_running(self.core, namespace, name, timeout=120, ready=False)

    def _remove(self, namespace: str) -> None:
        self.core.delete_namespace(namespace)
        kubepods.wait_for(
            lambda: not self.core.list_namespaced_pod(namespace).items,
            f"the pods of {namespace} gone",
            300,
        )


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def mib(kib: float) -> float:
    return round(kib / 1024, 1)


def summary(results: dict[str, Case], pods: int, load: list[float]) -> dict[str, Any]:
    none = results["none"].sandboxes
    base50, base99 = statistics.median(none), percentile(none, 99)
    out: dict[str, Any] = {
        "pods_per_case": pods,
        "sandbox_p50_ms_without": ms(base50),
        "sandbox_p99_ms_without": ms(base99),
    }
    for case in ("ours", "istio"):
        r = results[case]
        p50, p99 = statistics.median(r.sandboxes), percentile(r.sandboxes, 99)
        out[f"sandbox_p50_ms_{case}"] = ms(p50)
        out[f"sandbox_p99_ms_{case}"] = ms(p99)
        out[f"sandbox_overhead_p50_ms_{case}"] = ms(p50 - base50)
        out[f"sandbox_overhead_p99_ms_{case}"] = ms(p99 - base99)
        out[f"agent_peak_rss_mib_{case}"] = mib(max(r.agent_hwm_kib))
        out[f"plugin_peak_rss_mib_p50_{case}"] = mib(statistics.median(r.plugin_kib))
        out[f"plugin_peak_rss_mib_max_{case}"] = mib(max(r.plugin_kib))
        out[f"plugin_runs_measured_{case}"] = r.plugin_commands
    istio_overhead = out["sandbox_overhead_p50_ms_istio"]
    out["sandbox_overhead_p50_ratio"] = (
        round(out["sandbox_overhead_p50_ms_ours"] / istio_overhead, 3) if istio_overhead else None
    )
    # The contract's names: both agents' figures side by side.
    out["sandbox_overhead_p50_ms"] = {
        c: out[f"sandbox_overhead_p50_ms_{c}"] for c in ("ours", "istio")
    }
    out["sandbox_overhead_p99_ms"] = {
        c: out[f"sandbox_overhead_p99_ms_{c}"] for c in ("ours", "istio")
    }
    out["agent_peak_rss_mib"] = {c: out[f"agent_peak_rss_mib_{c}"] for c in ("ours", "istio")}
    out["plugin_peak_rss_mib"] = {c: out[f"plugin_peak_rss_mib_max_{c}"] for c in ("ours", "istio")}
    out["load_average"] = round(statistics.fmean(load), 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=30, help="timed pods per case (all rounds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--extra", type=int, default=EXTRA, help="untimed pods per agent and round")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/node_side_by_side.py needs root (a real node)")
    log = sys.stderr if opts.json else sys.stdout
    binary = helm_binaries()[max(helm_binaries(), key=lambda v: v.split(".")[0])]
    workdir = Path(tempfile.mkdtemp(prefix="node-sbs-"))
    cluster = RealCluster(workdir)
    per_round = [
        opts.pods // opts.rounds + (i < opts.pods % opts.rounds) for i in range(opts.rounds)
    ]
    load: list[float] = []
    try:
        cluster.start()
        bench = SideBySide(
            cluster, Helm(binary=binary, kubeconfig=cluster.kubeconfig, home=workdir / "helm"), log
        )
        for i, pods in enumerate(per_round):
            for case in CASES[i % 3 :] + CASES[: i % 3]:
                began = time.monotonic()
                bench.run(case, pods, opts.extra)
                load.append(os.getloadavg()[0])
                print(
                    f"round {i + 1} {case:5s}: {pods} pods in {time.monotonic() - began:.0f}s, "
                    f"load {load[-1]:.1f}",
                    file=log,
                    flush=True,
                )
        result = summary(bench.results, opts.pods, load)
    finally:
        cluster.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
