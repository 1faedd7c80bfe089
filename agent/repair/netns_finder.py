"""Find a running pod's network namespace on the node from its IP addresses.

A pod's netns has no stable name we can rely on: runtimes bind-mount it under various dirs, and
some keep it only as `/proc/<pid>/ns/net` of the pause process. We look at both the mounted netns
dir and every process in the node's /proc, visit each distinct namespace once, and pick the one
holding the pod's address. Among processes, the oldest wins: that is the sandbox's pause process,
which outlives short-lived init containers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator

from agent.errors import AgentError

log = logging.getLogger(__name__)

AddressReader = Callable[[str], set[str]]


def index_netns_by_address(
    *, netns_dir: str, proc_dir: str, read_addresses: AddressReader
) -> dict[str, str]:
    """Map every address found in the node's network namespaces to a path of that netns.

    One pass serves every pod of a repair round: each namespace is entered once, not once per pod.
    """
    index: dict[str, str] = {}
    seen: set[tuple[int, int]] = set()
    for path in _candidate_paths(netns_dir=netns_dir, proc_dir=proc_dir):
        try:
            st = os.stat(path)
        except OSError:
            continue  # the process exited or the mount went away meanwhile
        identity = (st.st_dev, st.st_ino)
        if identity in seen:
            continue
        seen.add(identity)
        try:
            addresses = read_addresses(path)
        except (OSError, AgentError) as e:
            log.debug("cannot read addresses of netns %s: %s", path, e)
            continue
        for address in addresses:
            index.setdefault(address, path)
    return index


def find_pod_netns(pod_ips: Iterable[str], index: dict[str, str]) -> str | None:
    """The netns holding one of the pod's addresses, from an index of this round."""
    for ip in pod_ips:
        if ip in index:
            return index[ip]
    return None


def _candidate_paths(*, netns_dir: str, proc_dir: str) -> Iterator[str]:
    try:
        names = sorted(os.listdir(netns_dir))
    except OSError:
        names = []
    for name in names:
        yield os.path.join(netns_dir, name)
    for pid in _pids_oldest_first(proc_dir):
        yield os.path.join(proc_dir, str(pid), "ns", "net")


def _pids_oldest_first(proc_dir: str) -> list[int]:
    started: list[tuple[int, int]] = []
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        start = _start_time(os.path.join(proc_dir, entry, "stat"))
        if start is not None:
            started.append((start, int(entry)))
    return [pid for _, pid in sorted(started)]


def _start_time(stat_path: str) -> int | None:
    try:
        with open(stat_path) as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime) counts after the parenthesised command, which may contain spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
