"""What telling the node's processes' connections apart costs the HTTP port's loop
(agent.serving.node_processes, agent.serving.socket_diag), on this machine's real /proc.

    .venv/bin/python -m bench.node_processes [--fds 200] [--rounds 2000] [--json]

Root (other processes' descriptors are read). Measured, each the median of `--rounds` calls:
- `lookup`: the exact sock_diag lookup of the far end of one accepted loopback connection;
- `relist`: one listing of a known node process's sockets, a child holding `--fds` descriptors
  (kubelet holds a few hundred);
- `scan`: one scan of every process of the machine for one socket (the worst case: the holder
  found last, or none), with the machine's process and descriptor counts beside it.
Prints a table, and with `--json` one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from agent.podnetns.cgroup import pod_uid_of_cgroups
from agent.serving.node_processes import NodeProcesses
from agent.serving.socket_diag import peer_socket_inode

HOLDER = textwrap.dedent(
    """
    import os, socket, sys
    held = [socket.socket() for _ in range(int(sys.argv[1]))]
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def median_us(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def machine() -> tuple[int, int]:
    """(processes, descriptors) readable on this machine."""
    processes = descriptors = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                descriptors += len(os.listdir(f"/proc/{entry}/fd"))
                processes += 1
            except OSError:
                continue
    return processes, descriptors


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.node_processes")
    parser.add_argument("--fds", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    lookup = median_us(lambda: peer_socket_inode(accepted), args.rounds)

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(args.fds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with tempfile.TemporaryDirectory() as proc:
            entry = Path(proc) / str(holder.pid)
            entry.mkdir()
            (entry / "fd").symlink_to(f"/proc/{holder.pid}/fd")
            (entry / "cgroup").write_text("1:name=systemd:/system.slice/kubelet.service\n")
            known = NodeProcesses(proc, pod_uid_of_cgroups)
            known._known[holder.pid] = None  # as a scan would have found it
            relist = median_us(known.relist, args.rounds)
        everyone = NodeProcesses("/proc", pod_uid_of_cgroups, scan_every=0.0)
        scan = median_us(lambda: everyone.scan({1}), max(10, args.rounds // 100))
    finally:
        holder.kill()
        holder.wait()
        for sock in (accepted, client, listener):
            sock.close()
    processes, descriptors = machine()
    result = {
        "lookup_us": round(lookup, 1),
        "relist_us": round(relist, 1),
        "relist_fds": args.fds,
        "scan_us": round(scan, 1),
        "processes": processes,
        "descriptors": descriptors,
    }
    print(f"exact sock_diag lookup      {lookup:9.1f} us")
    print(f"relist ({args.fds} descriptors)  {relist:9.1f} us")
    print(f"scan ({processes} processes, {descriptors} descriptors)  {scan:9.1f} us")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
