"""An agent process's RSS, threads and open descriptors, read from /proc on the node's host
(the agent's container shares the machine's kernel). The RSS also split as the kernel counts it:
anonymous pages (the heap, thread stacks, what the allocators hold) and file-backed or shared
pages (code and data of the interpreter and libraries, paged in as code paths first run), so a
rise can be told apart: only the first kind can be a leak."""

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
    anon_mib: float = 0.0
    """RssAnon."""
    file_mib: float = 0.0
    """RssFile + RssShmem."""


def read(pid: int, *, node: str, at: float, proc: Path = PROC) -> AgentSample | None:
    """The process's figures now; None when it is gone (killed between listing and reading)."""
    try:
        status = (proc / str(pid) / "status").read_text()
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

    def mib(*names: str) -> float:  # a zombie has none of them
        return sum(int(fields[n].split()[0]) for n in names if n in fields) / 1024.0

    return AgentSample(
        at,
        node,
        pid,
        mib("VmRSS"),
        int(fields["Threads"]),
        fds,
        anon_mib=mib("RssAnon"),
        file_mib=mib("RssFile", "RssShmem"),
    )
