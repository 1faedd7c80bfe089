"""CNI ADD latency and the agent's CPU, quiet and while a neighbour floods the HTTP port with
requests (not connections: bench/flood.py holds those).

    cd REPO && flock /work/ci-runs/node.lock .venv/bin/python \\
        -m bench.request_flood [--adds 500] [--pipelined 400] [--pause 0.05] [--pod-socket]

What runs (root; after ci/setup-testbed): testbed/netns_agent.py's bed, the one the hostile
tier uses (the real agent process in a node netns of its own, ambient on, a control plane, 10
sidecar pods bound to the node, 30 pod netns ADDed once untimed). Timed: sequential ADDs through
the pod socket with the plugin's own client, while kubelet's probe (/healthz, 1 s timeout, from
the node's own address) runs every 0.2 s. The flood is testbed/attacks.py, its own process on
the machine's side of the node's veth (a neighbour's address): `--pipelined` GETs of /healthz
in one write, again `--pause` seconds after each round's replies were read (400 every 50 ms:
about 8,000 requests a second against an agent with no budget); with `--pod-socket` also the
pod socket's status request the same way. Phases: quiet, flooded, quiet again. Per phase: ADD
p50 / p99, failed ADDs, the probe's slowest answer and failures, the agent's CPU (utime + stime
from /proc) per second of the phase, and what the flood was answered.

    .venv/bin/python -m bench.request_flood --loopback [--seconds 10]

With `--go [--senders K]` either flood comes from testbed/attacks_go (built by ci/setup-testbed),
the same rounds from K concurrent senders of one Go process: a faster flood than one Python
process sends on a small machine.

No root, no test bed: the agent's HTTP server alone (agent.http_server, as the agent builds it)
in a child process on loopback, with its request budget and without (`rates=None`), flooded the
same way from 127.0.0.1 while a prober GETs /healthz every 0.2 s from 127.0.0.2 (the node's own
address, kubelet's): the server process's CPU per second, what the flood was answered, the
probe's slowest answer and failures.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from testbed import parts
from testbed.flood import Flood
from testbed.netns_agent import NetnsAgentBed, Phase


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(bed: NetnsAgentBed, adds: int) -> tuple[Phase, float]:
    """The phase, and the agent's CPU seconds per second during it."""
    assert bed.agent is not None
    pid = bed.agent.proc.pid
    cpu, began = cpu_seconds(pid), time.monotonic()
    phase = bed.measure(adds)
    return phase, (cpu_seconds(pid) - cpu) / (time.monotonic() - began)


def row(name: str, phase: Phase, cpu: float, answered: str) -> str:
    return (
        f"| {name} | {phase.p50:.1f} | {phase.p99:.1f} | {len(phase.failures)} | "
        f"{max(phase.probes):.0f} | {len(phase.probe_failures)} | {cpu:.2f} | {answered} |"
    )


SERVE = """
import sys, time
from agent.http_server import HttpServer
from agent.liveness import Liveness
kw = {} if sys.argv[1] == "budget" else {"rates": None}
srv = HttpServer(port=0, host="127.0.0.1", loops=Liveness().failing, **kw)
srv.start()
print(srv.bound_port, flush=True)
sys.stdin.read()
"""


def probe_loop(port: int, stop: threading.Event, took: list[float], failed: list[str]) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(
                "127.0.0.1", port, timeout=1.0, source_address=("127.0.0.2", 0)
            )
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
            conn.close()
            if status != 200:
                failed.append(str(status))
        except OSError as e:
            failed.append(repr(e))
        took.append((time.perf_counter() - began) * 1000)
        stop.wait(0.2)


def flood(targets: list[str], opts: argparse.Namespace) -> Flood:
    """testbed/attacks.py's pipelined flood on `targets`, or testbed/attacks_go's (`--go`)."""
    how = [*targets, "--pipelined", str(opts.pipelined), "--pause", str(opts.pause)]
    if opts.go:
        program = parts.attacks_go().require()
        return Flood([*how, "--senders", str(opts.senders)], program=program)
    return Flood(how, module="testbed.attacks")


def loopback(case: str, opts: argparse.Namespace) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", SERVE, case], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdout is not None and child.stdin is not None
    port = int(child.stdout.readline())
    stop, took, failed = threading.Event(), [], []  # type: ignore[var-annotated]
    prober = threading.Thread(target=probe_loop, args=(port, stop, took, failed))
    try:
        with flood(["--target", f"tcp:127.0.0.1:{port}"], opts) as f:
            prober.start()
            cpu, began = cpu_seconds(child.pid), time.monotonic()
            time.sleep(opts.seconds)
            used, lasted = cpu_seconds(child.pid) - cpu, time.monotonic() - began
            report = f.stop()
    finally:
        stop.set()
        if prober.is_alive():
            prober.join()
        child.stdin.close()
        child.kill()
        child.wait()
    (count,) = report.values()
    return (
        f"| {case} | {used / lasted:.2f} | {count['replies'] / lasted:,.0f} | "
        f"{count['rounds']} | {max(took):.0f} | {len(failed)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_flood")
    parser.add_argument("--loopback", action="store_true")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--adds", type=int, default=500)
    parser.add_argument("--pipelined", type=int, default=400)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--pod-socket", action="store_true")
    parser.add_argument("--go", action="store_true")
    parser.add_argument("--senders", type=int, default=2)
    opts = parser.parse_args()
    if opts.loopback:
        print(
            "| HTTP server | server CPU s/s | flood answered / s | flood rounds "
            "| /healthz max ms | failed probes |\n|---|---|---|---|---|---|"
        )
        for case in ("none", "budget", "none", "budget"):
            print(loopback(case, opts), flush=True)
        return 0
    if os.geteuid() != 0:
        sys.exit("bench/request_flood.py needs root (network namespaces)")
    workdir = Path(tempfile.mkdtemp(prefix="istio-cni-request-flood-"))
    bed = NetnsAgentBed(workdir)
    print(
        "| phase | ADD p50 ms | ADD p99 ms | failed ADDs | /healthz max ms | failed probes "
        "| agent CPU s/s | what the flood was answered |\n|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    try:
        bed.start()
        bed.warm()
        host, port = bed.http_address
        targets = ["--target", f"tcp:{host}:{port}"]
        if opts.pod_socket:
            targets += ["--target", f"unix:{bed.pod_socket}"]
        print(row("quiet", *timed(bed, opts.adds), ""), flush=True)
        with flood(targets, opts) as attacker:
            began = time.monotonic()
            phase, cpu = timed(bed, opts.adds)
            report = attacker.stop()
            lasted = time.monotonic() - began
        answered = "; ".join(
            f"{name}: {c['replies'] / lasted:,.0f} replies/s in {c['rounds']} rounds"
            f" ({c['errors']} cut)"
            for name, c in report.items()
        )
        print(row("HTTP port flooded", phase, cpu, answered), flush=True)
        print(row("quiet, after", *timed(bed, opts.adds), ""), flush=True)
    finally:
        bed.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
