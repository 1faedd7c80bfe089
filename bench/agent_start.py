"""The real agent process's start-up cost against the real kube-apiserver: CPU seconds from exec
to Ready, RSS after start-up and in steady state, for one or more checkouts of the agent.

    .venv/bin/python -m bench.agent_start --runs 3 --agent-root /work/old --agent-root . --json

What runs (root; the scale tier's bed, tests/scale/conftest.py): the test bed's control plane
(etcd without fsync), a node network namespace, the node registered, the agent's own
ServiceAccount with the chart's rights, 3 sidecar pods on its node, then `--namespaces`
namespaces and `--pods` pods of other nodes created through the API (testbed/apiload.py). Per
run, one agent (`istio-cni-agent run`, ambient on: the pod and the namespace caches) in the node
netns, from the checkout named by `--agent-root` (its code first on sys.path: `python -P` with
PYTHONPATH, the same interpreter and packages for every checkout); the checkouts alternate run
by run on the same cluster. Measured from /proc/PID:
  ready_cpu_s      utime + stime from exec to Ready (every readiness check the agent exports but
                   ambient's, which waits for a ztunnel none runs here: api, install, rules,
                   ... all passing on /metrics, polled every 50 ms);
  ready_s          wall seconds from exec to Ready (load-sensitive; CPU is the figure);
  start RSS        VmRSS and VmHWM `--settle` seconds after Ready;
  steady RSS/CPU   VmRSS and VmHWM after `--steady` more seconds, and the CPU seconds spent in
                   them;
and the load average (1 min) at each run's exec. Medians per checkout are printed last.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from testbed import apiload
from testbed.agent_host import make_node, running_agent
from testbed.controlplane import Binaries, ControlPlane
from testbed.identity import service_account_identity
from testbed.node import NodePods, new_core, register_node
from testbed.nodenet import NodeNetwork
from testbed.wait import wait_for
from tests.scale.conftest import (
    AGENT_ACCOUNT,
    AGENT_NAMESPACE,
    METRICS_PORT,
    NODE,
    OWN_PODS,
    SIDECAR,
    grant_agent,
)

NOT_AWAITED = frozenset({"ambient"})
"""Waits for a ztunnel, which none runs here."""


def proc_figures(pid: int) -> dict[str, float]:
    """utime + stime (s), VmRSS and VmHWM (MiB) of `pid`."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if "kB" in line}
    return {
        "cpu_s": (int(stat[11]) + int(stat[12])) / tick,
        "rss_mib": kib["VmRSS"] / 1024,
        "hwm_mib": kib["VmHWM"] / 1024,
    }


def get(host: str, port: int, path: str) -> str:
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def ready_checks(host: str, port: int) -> dict[str, bool]:
    """The readiness checks the agent exports (istio_cni_ready_check), passing or not."""
    checks = {}
    for line in get(host, port, "/metrics").splitlines():
        if line.startswith("istio_cni_ready_check{"):
            name = line.split('check="', 1)[1].split('"', 1)[0]
            checks[name] = line.rsplit(" ", 1)[1] == "1.0"
    return checks


def one_run(
    args: argparse.Namespace, root: Path, network: NodeNetwork, kubeconfig: Path, workdir: Path
) -> dict[str, Any]:
    node_dir = workdir / f"agent-{secrets.token_hex(3)}"
    node_dir.mkdir()
    node = make_node(node_dir)
    node.write_primary({"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]})
    run_dir = Path("/tmp") / f"agentstart-{secrets.token_hex(4)}"  # socket paths stay short
    config = node.write_config_yaml(
        metricsAddress=network.node_ip,
        metricsPort=METRICS_PORT,
        cniAgentRunDir=str(run_dir),
        uninstallOnStop="never",
        hostProcDir="/proc",
        logAsJson=True,
        ambient={"enabled": True, "ipv6": False, "ztunnelSocketPath": f"{run_dir}/zt.sock"},
    )
    # -P: the checkout's code (PYTHONPATH) before the venv's editable install of this one.
    command = [
        *network.nsenter(),
        sys.executable,
        "-P",
        "-m",
        "agent.cli",
        "run",
        "--config",
        str(config),
    ]
    env = {"KUBECONFIG": str(kubeconfig), "NODE_NAME": NODE, "PYTHONPATH": str(root)}
    load = os.getloadavg()[0]
    port = METRICS_PORT
    try:
        with running_agent(command, **env) as agent:
            pid = agent.proc.pid
            began = time.monotonic()

            def ready() -> bool:
                if agent.proc.poll() is not None:
                    raise RuntimeError(f"agent exited:\n{agent.log.read_text()[-3000:]}")
                try:
                    checks = ready_checks(network.node_ip, port)
                except OSError:
                    return False
                wanted = [c for c in checks if c not in NOT_AWAITED]
                return "api" in wanted and all(checks[c] for c in wanted)

            def last() -> str:
                try:
                    return get(network.node_ip, port, "/readyz")
                except OSError as e:
                    return repr(e)

            wait_for(ready, "the agent Ready", 90, interval=0.05, on_timeout=last)
            at_ready = proc_figures(pid)
            ready_s = time.monotonic() - began
            checks = ready_checks(network.node_ip, port)
            time.sleep(args.settle)
            started = proc_figures(pid)
            time.sleep(args.steady)
            steady = proc_figures(pid)
            code, log = agent.stop()
    finally:
        for path in sorted(run_dir.glob("*")):
            path.unlink(missing_ok=True)
        if run_dir.exists():
            run_dir.rmdir()
    warnings = sum('"level":"warn' in line or '"level":"error' in line for line in log.splitlines())
    return {
        "root": str(root),
        "commit": subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "load1": round(load, 2),
        "ready_s": round(ready_s, 2),
        "ready_cpu_s": round(at_ready["cpu_s"], 2),
        "start_rss_mib": round(started["rss_mib"], 1),
        "start_hwm_mib": round(started["hwm_mib"], 1),
        "steady_rss_mib": round(steady["rss_mib"], 1),
        "steady_hwm_mib": round(steady["hwm_mib"], 1),
        "steady_cpu_s": round(steady["cpu_s"] - started["cpu_s"], 2),
        "checks": checks,
        "exit": code,
        "log_warnings": warnings,
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = Path(args.workdir or f"/tmp/agent-start-{secrets.token_hex(3)}")
    workdir.mkdir(parents=True)
    network = NodeNetwork()
    plane: ControlPlane | None = None
    core = None
    results: list[dict[str, Any]] = []
    try:
        network.create()
        plane = ControlPlane(
            workdir / "controlplane",
            Binaries.from_cache(),
            address=network.gateway,
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
        if args.namespaces or args.pods:
            loaded = apiload.load_cluster(plane, namespaces=args.namespaces, pods=args.pods)
            print(f"loaded: {loaded}", file=sys.stderr)
        for n in range(args.runs):
            for root in args.agent_root:
                result = one_run(args, Path(root).resolve(), network, identity.kubeconfig, workdir)
                result["run"] = n + 1
                print(json.dumps(result), file=sys.stderr)
                results.append(result)
    finally:
        if core is not None:
            core.api_client.close()
        if plane is not None:
            plane.stop()
        network.delete()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    return results


def medians(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    figures = [
        *("load1", "ready_s", "ready_cpu_s", "start_rss_mib", "start_hwm_mib"),
        *("steady_rss_mib", "steady_hwm_mib", "steady_cpu_s"),
    ]
    out: dict[str, dict[str, float]] = {}
    for root in dict.fromkeys(r["root"] for r in results):
        mine = [r for r in results if r["root"] == root]
        out[f"{mine[0]['commit']} ({root})"] = {
            f: round(statistics.median(r[f] for r in mine), 2) for f in figures
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--agent-root", action="append", help="a checkout to run the agent from (repeatable)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout, alternating")
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=20000, help="pods of other nodes")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after Ready")
    parser.add_argument("--steady", type=float, default=60.0, help="steady seconds measured")
    parser.add_argument("--workdir", help="default: a new directory under /tmp")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.agent_root = args.agent_root or [str(Path(__file__).resolve().parents[1])]
    results = run(args)
    summary = {"runs": results, "medians": medians(results)}
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
