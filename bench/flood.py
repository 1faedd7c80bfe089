"""CNI ADD latency and the agent's threads and descriptors, quiet and under connection floods.

    cd REPO && flock /tmp/istio-cni-heavy.lock .venv/bin/python \\
        -m bench.flood [--adds 500] [--idle 10000] [--slowloris 100] [--sockets 1000]

What runs (root; after ci/setup-testbed): testbed/netns_agent.py's bed, the one the hostile
tier uses: `istio-cni-agent run` as a real process in a node netns of its own with ambient on,
a control plane reached over the node's veth, 10 sidecar pods bound to the node, 30 pod netns
(each ADDed once, untimed, so that every timed ADD re-applies the pod's rules alike), the
ztunnel test double connected to the ZDS socket. Timed: sequential ADDs through the pod socket
with the plugin's own client (plugin.client.AgentClient: connect, request, reply), pod from the
agent's cache, decision, rules applied in the netns. Meanwhile another thread reads the agent's
/proc/PID/status Threads and /proc/PID/fd count and GETs /healthz (kubelet's probe, 1 s timeout)
every 0.2 s. Each flood is testbed/flood.py as its own process, started and fully connected
before the ADDs, held during them (and for at least 6.5 s: past the HTTP request timeout), ended
after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from agent.serving import limits
from testbed.flood import Flood
from testbed.netns_agent import NetnsAgentBed, Phase

HOLD_SECONDS = limits.HTTP.request_timeout + 1.5


def floods(bed: NetnsAgentBed, opts: argparse.Namespace) -> list[tuple[str, list[str]]]:
    host, port = bed.http_address
    tcp = ["--tcp", f"{host}:{port}"]
    pod = ["--stream", bed.pod_socket, "--stream-idle", str(opts.sockets)]
    zds = ["--seqpacket", bed.zds_socket, "--seqpacket-idle", str(opts.sockets)]
    return [
        (f"15014: {opts.idle} idle", [*tcp, "--idle", str(opts.idle)]),
        (f"15014: {opts.slowloris} slowloris", [*tcp, "--slowloris", str(opts.slowloris)]),
        (f"pod socket: {opts.sockets} idle", pod),
        (f"ZDS socket: {opts.sockets} idle", zds),
        (
            "all of the above at once",
            [*tcp, "--idle", str(opts.idle), "--slowloris", str(opts.slowloris), *pod, *zds],
        ),
    ]


def row(name: str, phase: Phase, report: dict[str, object] | None) -> str:
    held = "" if report is None else summary(report)
    return (
        f"| {name} | {phase.p50:.1f} | {phase.p99:.1f} | {len(phase.failures)} | "
        f"{phase.threads} | {phase.fds} | {max(phase.probes):.0f} | "
        f"{len(phase.probe_failures)} | {held} |"
    )


def summary(report: dict[str, object]) -> str:
    """What the flood saw: connections made and how many the agent closed."""
    parts = []
    for name, tally in report.items():
        assert isinstance(tally, dict)
        text = f"{name} {tally['made']} made, {tally['closed_by_server']} closed by the agent"
        if name == "slowloris":
            text += f" (held at most {tally['held_max']:.1f} s)"
        parts.append(text)
    return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flood")
    parser.add_argument("--adds", type=int, default=500)
    parser.add_argument("--idle", type=int, default=10000)
    parser.add_argument("--slowloris", type=int, default=100)
    parser.add_argument("--sockets", type=int, default=1000)
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/flood.py needs root (network namespaces)")
    workdir = Path(tempfile.mkdtemp(prefix="istio-cni-flood-bench-"))
    bed = NetnsAgentBed(workdir)
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(
        "| flood | ADD p50 ms | ADD p99 ms | failed ADDs | agent threads (max) | agent fds "
        "(max) | /healthz max ms | failed probes | what the flood saw |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        bed.start()
        bed.warm()
        print(row("none (quiet)", bed.measure(opts.adds), None), flush=True)
        for name, args in floods(bed, opts):
            with Flood(args) as flood:
                began = time.monotonic()
                phase = bed.measure(opts.adds)
                # Held long enough for the slowloris connections to meet their timeout.
                time.sleep(max(0.0, HOLD_SECONDS - (time.monotonic() - began)))
                report = flood.stop()
            print(row(name, phase, report), flush=True)
        print(row("none (quiet, after)", bed.measure(opts.adds), None), flush=True)
        print(f"load average {os.getloadavg()[0]:.2f}")
    finally:
        bed.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
