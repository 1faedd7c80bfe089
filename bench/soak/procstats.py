"""An agent process's RSS, threads and open descriptors, read from /proc on the node's host
(the agent's container shares the machine's kernel)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class AgentSample:
    at: float
    node: str
    pid: int
    rss_mib: float
    threads: int
    fds: int


def read(pid: int, *, node: str, at: float, proc: Path = PROC) -> AgentSample | None:
    """The process's figures now; None when it is gone (killed between listing and reading)."""
    try:
        status = (proc / str(pid) / "status").read_text()
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields["VmRSS"].split()[0]) if "VmRSS" in fields else 0  # a zombie has none
    return AgentSample(at, node, pid, rss_kib / 1024.0, int(fields["Threads"]), fds)
