"""Wait for the machine to be quiet before a timed phase: work left by the previous phase or run
(the kernel tears deleted network namespaces down in the background; a node goes on stopping
containers after the API says their pods are gone) would slow whichever case runs next."""

from __future__ import annotations

import time
from pathlib import Path

QUIET_BUSY = 0.20
"""At most this share of all CPUs busy over the window."""


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def wait_quiet(window: float = 5.0, timeout: float = 300.0, busy: float = QUIET_BUSY) -> float:
    """Until the CPUs were at most `busy` busy over `window` seconds (or `timeout` passed);
    returns the last window's busy share (0-1), to be reported beside the figures."""
    deadline = time.monotonic() + timeout
    while True:
        busy0, total0 = cpu_times()
        time.sleep(window)
        busy1, total1 = cpu_times()
        share = (busy1 - busy0) / max(1, total1 - total0)
        if share <= busy or time.monotonic() > deadline:
            return share
